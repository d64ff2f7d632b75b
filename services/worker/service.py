"""The worker process (one per node): runs the containers placed on it.

- At start it prepares its runtime (runc: the base root file system, the bridge; or plain
  processes), removes what a crashed predecessor left and says those containers failed
  (levers9.worker.lifecycle.restart), then registers with its capacity and features and heartbeats.
- It consumes ContainerScheduled / ContainerStopRequested / ContainerCheckpointRequested and acts only on its
  own containers. A placement carries everything the start needs (spec, resources, checkpoint, and its
  GPUs' cards are chosen here: levers9.worker.gpus.node): no projection is read to start it
  (levers9.worker.lifecycle.placement).
- For a placement: code archive from the gateway (with its worker token), secrets decrypted, the
  container started or restored (ContainerStarted), the runner's health polled until ready
  (ContainerReady with the address) or failed (ContainerFailed with the reason from the log).
- A monitor loop notices containers that exit or run out of memory, and stops the ones idle for
  keep_warm_seconds (scale to zero: ContainerStopped; the rule is levers9.worker.lifecycle.idle).
- Checkpoints: levers9.worker.checkpoints.orchestration; HTTP routes: levers9.worker.routes; the node
  cache it serves: levers9.worker.images.cache_server; a placement's code: levers9.worker.lifecycle.code.
- A build-pool worker also runs the builds given to it (ImageBuildStarted), one at a time (levers9.worker.builds.builder).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
from fastapi import FastAPI

from levers9.contracts import SYSTEM_WORKSPACE, envelope, subjects
from levers9.contracts import events as E
from levers9.contracts.images import BUILD_POOL
from levers9.runtime.consumer import Delivery, WorkConsumer
from levers9.runtime.service import Service
from levers9.runtime.tasks import spawn
from levers9.runtime.views import CheckpointsView, ContainersView, DeploymentsView, SecretsView, WorkersView
from levers9.worker.builds.builder import Builds
from levers9.worker.checkpoints.orchestration import Checkpoints, enable_criu
from levers9.worker.gpus.node import NodeGpus
from levers9.worker.images.cache_server import serve_cache
from levers9.worker.images.node_cache import NodeCache
from levers9.worker.lifecycle import restart
from levers9.worker.lifecycle.code import fetch_code
from levers9.worker.lifecycle.idle import should_stop_idle
from levers9.worker.lifecycle.placement import Overtaken, Running, runner_env
from levers9.worker.lifecycle.sdk_mount import sdk_mount
from levers9.worker.lifecycle.secret_source import SecretSource
from levers9.worker.mounts import volumes
from levers9.worker.runtime.choice import choose_runtime
from levers9.worker.runtime.interface import ContainerSpec, Exit, Runtime, Started
from levers9.worker.sandboxes.catalogue_check import CatalogueCheck
from levers9.worker.sandboxes.sandboxes import Sandboxes, generation_refusal, is_function

from .routes import add_routes

log = logging.getLogger("levers9.worker")

HEARTBEAT_EVERY_S = 2.0
MONITOR_EVERY_S = 1.0
HEALTH_POLL_S = 0.02
NOTHING_TO_RUN = "nothing to run: the request names no deployment"


class WorkerService(Service):
    name = "worker"
    # ContainersView is not read to start anything (a placement carries what the start needs); it
    # stays because tests/test_e2e_stack.py proves exactly-once projection under SIGKILL with it
    projections = (ContainersView(), DeploymentsView(), SecretsView(), WorkersView(), CheckpointsView())
    runtime: Runtime

    def __init__(self, settings) -> None:
        super().__init__(settings)
        self.state_dir = self.settings.home_path / "workers" / self.worker_id
        self.runtime_note = ""
        self.ready = asyncio.Event()
        self.containers: dict[str, Running] = {}
        self.overtaken = Overtaken()
        self.prepare_error, self.criu_note = "", "not checked"
        self.gpus = NodeGpus(self.settings, self.state_dir)  # its cards (levers9.worker.gpus.node)
        self.cache = NodeCache(Path(self.settings.images.image_cache) / "blobs", self.settings, self.settings.images.cache_max_bytes)
        self.cache_url = f"http://{self.settings.process.http_host}:{self.settings.images.cache_port}"
        self.sdk_dir = sdk_mount(self.settings.home_path)  # containers' /opt/levers9: the SDK alone
        self.checkpoints = Checkpoints(self)
        self.sandboxes = Sandboxes(self.settings, self.state_dir)
        self.secret_source = SecretSource(self.settings, lambda ws, names: self.pool.fetch(
            "SELECT name, ciphertext FROM worker.secrets WHERE workspace=$1 AND name = ANY($2)", ws, names))
        self.volumes = volumes.WorkerVolumes(self.settings, self.worker_id, self.state_dir, self.secret_env)
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
        self.run_lock: int | None = await asyncio.to_thread(restart.take_run_lock, self.state_dir)
        self.runtime, self.runtime_note = choose_runtime(self.settings, self.state_dir)
        log.info("worker %s: %s", self.worker_id, self.runtime_note)

    def background(self):
        return [self.prepare_and_register, self.heartbeat, self.monitor, self.serve_cache, self.sandboxes.serve,
                self.volumes.serve, self.sandboxes.egress.serve]

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
        await self.register()

    async def register(self) -> None:
        s = self.settings
        registered = E.WorkerRegistered(
            worker_id=self.worker_id, pool=s.worker.pool,
            cpu_millicores=s.worker.cpu_millicores or (os.cpu_count() or 1) * 1000,
            memory_mib=s.worker.memory_mib or psutil.virtual_memory().total // (1 << 20),
            features=list(self.runtime.features) + (["criu"] if self.runtime.checkpoint_ready else []),
            address=f"http://{s.process.http_host}:{s.process.http_port}", **(await self.gpus.register()))
        env = envelope(registered, workspace=SYSTEM_WORKSPACE)
        await self.bus.publish(env)
        await self.bus.publish(envelope(E.WorkerReady(worker_id=self.worker_id), workspace=SYSTEM_WORKSPACE,
                                        correlation_id=env.correlation_id, causation_id=env.id))
        self.ready.set()
        log.info("worker %s registered with %s", self.worker_id, registered.features)

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
        for c in list(self.containers.values()):
            await self.stop_container(c, "worker stopping")
        await self.runtime.close()  # what outlives containers: the runc runtime's image mounts
        try:
            kv = await self.bus.heartbeats()
            await kv.delete(self.worker_id)
        except Exception:  # noqa: BLE001 - the TTL removes it anyway
            log.warning("could not delete the heartbeat of %s (its TTL removes it)", self.worker_id, exc_info=True)
        lock = getattr(self, "run_lock", None)
        if lock is not None:  # its containers are stopped: a reaper finds nothing
            os.close(lock)
            self.run_lock = None

    async def heartbeat(self, stop: asyncio.Event) -> None:
        kv = await self.bus.heartbeats()
        while not stop.is_set():
            try:
                await kv.put(self.worker_id, json.dumps({"at": time.time(), "pid": os.getpid(),
                                                         "containers": len(self.containers)}).encode())
            except Exception as exc:  # noqa: BLE001 - NATS reconnecting; next beat retries
                log.warning("heartbeat failed: %s", exc)
            await _sleep(stop, HEARTBEAT_EVERY_S)

    # ---- placements ----------------------------------------------------------------------------

    async def on_container_event(self, d: Delivery) -> None:
        assert d.message is not None  # undecodable deliveries are dead-lettered before the handler
        ev = d.message.event
        if isinstance(ev, E.ContainerStopRequested):
            self.overtaken.saw(ev.container_id, d.seq, "its stop was requested")
            c = self.containers.get(ev.container_id)
            if c is not None:
                await self.stop_container(c, ev.reason or "stop requested")
        elif isinstance(ev, E.ContainerCheckpointRequested):
            c = self.containers.get(ev.container_id)
            if c is not None and c.ready_at is not None:
                self.checkpoints.requested(c)
        elif isinstance(ev, E.ContainerScheduled):
            if ev.worker_id != self.worker_id:
                self.overtaken.saw(ev.container_id, d.seq, f"it was placed on worker {ev.worker_id}")
            elif ev.container_id not in self.containers:
                await self.ready.wait()
                await self.on_placed(ev, d)

    async def on_placed(self, ev: E.ContainerScheduled, d: Delivery) -> None:
        """A placement on this worker: start the container in the background (the consumer goes on)."""
        stale = self.overtaken.stale(ev.container_id, d.seq)
        if stale:
            log.info("placement of %s (stream sequence %d) is stale: %s; skipping", ev.container_id, d.seq, stale)
            return
        self.overtaken.saw(ev.container_id, d.seq, "it was started here already")
        assert d.message is not None
        env = d.message.envelope
        c = Running(ev.container_id, env.workspace, ev.deployment_id, env.correlation_id, time.time(), spec=ev.spec,
                    deployment_version=ev.deployment_version, memory_mib=ev.resources.memory_mib,
                    scheduled_seq=d.seq)
        if ev.spec is None:  # a bare container request, or a placement from before the spec travelled
            why = NOTHING_TO_RUN if not ev.deployment_id else \
                f"nothing to run: the placement of deployment {ev.deployment_id} carries no spec"
            await self.finish(c, Exit(None, why), failed=True)
            return
        refusal = generation_refusal(ev.spec) if is_function(ev.spec) else ""
        if refusal:
            await self.finish(c, Exit(None, refusal), failed=True)
            return
        self.containers[c.container_id] = c
        c.task = spawn(self.start_container(c, ev), name=f"start {c.container_id}", logger=log)

    async def start_container(self, c: Running, ev: E.ContainerScheduled) -> None:
        assert c.spec is not None
        try:
            code_dir = await self.fetch_code(c)
            cspec = ContainerSpec(container_id=c.container_id, code_dir=code_dir,
                                  sdk_dir=self.sdk_dir,
                                  env=runner_env(c.spec, await self.secret_env(c.container_id, c.spec.secrets),
                                                 container_id=c.container_id, deployment_id=c.deployment_id,
                                                 max_body_bytes=self.settings.gateway.max_body_bytes),
                                  cpu_millicores=ev.resources.cpu_millicores, memory_mib=ev.resources.memory_mib,
                                  image=c.spec.image_ref, workspace=c.workspace, deployment_id=c.deployment_id,
                                  binds=await self.volumes.binds(c.workspace, c.container_id, c.spec, self.runtime),
                                  **self.gpus.take(c.container_id, c.spec),
                                  **(self.sandboxes.container_fields(c.container_id, c.workspace, c.spec.image_ref)
                                     if is_function(c.spec) else {}))
        except Exception as exc:  # noqa: BLE001 - every failure becomes ContainerFailed with its reason
            log.exception("container %s could not start", c.container_id)
            await self.finish(c, Exit(None, f"could not start: {type(exc).__name__}: {exc}"), failed=True)
            return
        try:
            if cspec.packages_dir is not None:
                await self.sandboxes.preinstall(cspec, c.spec, self.runtime)
        except Exception as exc:  # noqa: BLE001 - the call that asked for the sandbox gets why
            await self.finish(c, Exit(None, f"could not start: {exc}"), failed=True)
            return
        note = ""
        if ev.checkpoint is not None and not c.stopping:
            started, note = await self.checkpoints.restore(c, cspec, ev.checkpoint)
            if started is not None:
                c.restored_from = ev.checkpoint.checkpoint_id
                await self.started(c, started, note)
                return
        if c.stopping:  # stopped while its code was fetched: start nothing
            return
        try:
            started = await self.runtime.start(cspec)
        except Exception as exc:  # noqa: BLE001 - every failure becomes ContainerFailed with its reason
            log.exception("container %s could not start", c.container_id)
            await self.finish(c, Exit(None, f"could not start: {type(exc).__name__}: {exc}"), failed=True)
            return
        await self.started(c, started, note or self.gpus.cold_note(c.spec))

    async def started(self, c: Running, started: Started, note: str) -> None:
        assert c.spec is not None
        if c.stopping:  # stopped (and reported) while it started: its stop found nothing to stop yet
            await self.runtime.stop(c.container_id)
            return
        await self.emit(c, E.ContainerStarted(container_id=c.container_id, worker_id=self.worker_id,
                                              restored_from=c.restored_from, note=note))
        await self.wait_ready(c, started.address, float(c.spec.timeout_seconds))

    async def wait_ready(self, c: Running, address: str, timeout: float) -> None:
        deadline = time.monotonic() + max(timeout, 30.0)
        async with httpx.AsyncClient(timeout=2.0) as client:
            while time.monotonic() < deadline and not c.stopping:
                ended = await self.runtime.poll(c.container_id)
                if ended is not None:
                    await self.finish(c, ended, failed=True)
                    return
                try:
                    r = await client.get(f"{address}/_levers9/health")
                except httpx.HTTPError:
                    r = None
                if r is not None and r.status_code == 200:
                    published = await self.sandbox_address(c, address)
                    if not published:
                        return
                    c.address, c.ready_at = address, time.time()
                    await self.emit(c, E.ContainerReady(container_id=c.container_id, worker_id=self.worker_id,
                                                        address=published))
                    self.checkpoints.after_ready(c)
                    return
                if r is not None and r.status_code == 500:
                    error = _json(r).get("error", "the app failed to start")
                    await self.stop_container(c, f"app failed to start: {error}", failed=True)
                    return
                await asyncio.sleep(HEALTH_POLL_S)
        if not c.stopping:
            await self.stop_container(c, f"not ready within {timeout:.0f} s", failed=True)

    async def sandbox_address(self, c: Running, address: str) -> str:
        """Where the gateway reaches a ready container: its own address, or for a function sandbox
        the relay's once the executor answered ("" when it failed and was stopped)."""
        if not is_function(c.spec):
            return address
        try:
            return await self.sandboxes.ready_address(c.container_id)
        except Exception as exc:  # noqa: BLE001 - a sandbox without a working executor fails with why
            await self.stop_container(c, f"the executor did not start: {type(exc).__name__}: {exc}", failed=True)
            return ""

    async def fetch_code(self, c: Running) -> Path:
        return await fetch_code(self.settings, self.state_dir, c)

    async def secret_env(self, container_id: str, names: list[str]) -> dict[str, str]:
        """A placed container's secrets: opened here with the keyring, or by the gateway (secret_source)."""
        return await self.secret_source(self.containers[container_id], names)

    # ---- stopping ------------------------------------------------------------------------------

    async def stop_container(self, c: Running, reason: str, failed: bool = False) -> None:
        if c.stopping:
            return
        c.stopping = True
        try:
            ended = await self.runtime.stop(c.container_id)
        except Exception as exc:  # noqa: BLE001 - the stop is reported with why it failed
            ended = Exit(None, f"stop failed: {exc}")
        if ended.oom:
            reason, failed = ended.reason, True
        await self.finish(c, Exit(ended.code, reason, ended.oom), failed=failed)

    async def finish(self, c: Running, ended: Exit, failed: bool) -> None:
        self.containers.pop(c.container_id, None)
        self.sandboxes.forget(c.container_id)
        self.gpus.free(c.container_id)  # its cards, once it is stopped
        if failed:
            tail = self.runtime.log_tail(c.container_id)
            reason = ended.reason + (f"; log: {tail}" if tail and tail not in ended.reason else "")
            if not c.stopping:
                try:
                    await self.runtime.stop(c.container_id)
                except Exception:  # noqa: BLE001 - best effort cleanup; the failure is reported below
                    log.exception("cleaning up the failed container %s", c.container_id)
            await self.emit(c, E.ContainerFailed(container_id=c.container_id, worker_id=self.worker_id,
                                                 exit_code=ended.code, reason=reason))
        else:
            await self.emit(c, E.ContainerStopped(container_id=c.container_id, worker_id=self.worker_id,
                                                  exit_code=ended.code or 0, reason=ended.reason))
        await self.volumes.release(c.container_id)  # its buckets, once it is stopped

    async def emit(self, c: Running, event: E.Event) -> None:
        await self.bus.publish(envelope(event, workspace=c.workspace, correlation_id=c.correlation_id))

    async def monitor(self, stop: asyncio.Event) -> None:
        async with httpx.AsyncClient(timeout=1.0) as client:
            while not stop.is_set():
                await _sleep(stop, MONITOR_EVERY_S)
                draining = await self.draining()
                for c in list(self.containers.values()):
                    if c.stopping or c.ready_at is None or c.deployment_id in self.checkpoints.dumping:
                        continue  # never stop a container in the middle of its dump
                    try:
                        await self.check(client, c, draining)
                    except Exception:  # noqa: BLE001 - next round checks again
                        log.exception("checking %s failed", c.container_id)

    async def check(self, client: httpx.AsyncClient, c: Running, draining: bool) -> None:
        assert c.ready_at is not None
        ended = await self.runtime.poll(c.container_id)
        if ended is not None:
            await self.finish(c, ended, failed=True)
            return
        if draining:
            await self.stop_container(c, f"worker {self.worker_id} drained")
            return
        try:
            status = (await client.get(f"{c.address}/_levers9/status")).json()
        except (httpx.HTTPError, ValueError):
            return
        why = should_stop_idle(time.time(), c.ready_at, status.get("last_request_at"), status.get("inflight", 0),
                               c.keep_warm_seconds)
        if why:
            await self.stop_container(c, why)

    async def draining(self) -> bool:
        try:
            return bool(await self.pool.fetchval("SELECT draining FROM worker.workers WHERE worker_id=$1",
                                                 self.worker_id))
        except Exception:  # noqa: BLE001 - Postgres away: keep the containers, ask again next round
            log.warning("cannot read whether worker %s drains", self.worker_id, exc_info=True)
            return False

    # ---- HTTP ----------------------------------------------------------------------------------

    def routes(self, app: FastAPI) -> None:
        add_routes(app, self.containers, lambda cid: self.runtime.open_log(cid), self.worker_id)

    async def health_detail(self) -> dict:
        runtime = getattr(self, "runtime", None)
        return {"worker_id": self.worker_id, "runtime": runtime.name if runtime else "",
                "runtime_note": self.runtime_note, "registered": self.ready.is_set(), "criu": self.criu_note,
                "prepare_error": self.prepare_error, "containers": len(self.containers), "gpus": self.gpus.health(),
                **({"builds": {"current": self.builds.current, "finished": self.builds.finished}}
                   if self.builds is not None else {})}


def _json(r: httpx.Response) -> dict[str, Any]:
    try:
        body = r.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


async def _sleep(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    except asyncio.TimeoutError:
        pass
