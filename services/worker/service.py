"""The worker process (one per node): runs the containers placed on it.

- At start it prepares its runtime (runc: the base root file system, the bridge; or plain
  processes), removes what a crashed predecessor left, then registers with its capacity and
  runtime features and heartbeats into the KV bucket.
- It consumes ContainerScheduled / ContainerStopRequested and acts only on its own containers.
- For a placement: code archive from the gateway (with its worker token), secrets decrypted, the
  container started (ContainerStarted), the runner's health polled until ready (ContainerReady with
  the address) or failed (ContainerFailed with the reason from the log).
- A monitor loop notices containers that exit or run out of memory, and stops the ones idle for
  keep_warm_seconds (scale to zero: ContainerStopped).
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import socket
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
from fastapi import FastAPI, HTTPException
from fastapi.responses import PlainTextResponse, StreamingResponse

import levers9
from levers9.contracts import envelope, uuid7
from levers9.contracts import events as E
from levers9.runtime.consumer import Delivery, WorkConsumer
from levers9.runtime.secrets import decrypt
from levers9.runtime.service import Service
from levers9.runtime.bus import ConcurrencyConflict
from levers9.runtime.views import CheckpointsView, ContainersView, DeploymentsView, SecretsView, WorkersView

from . import checkpointing
from .node_cache import NodeCache, cache_app
from .runtime import ContainerSpec, Exit, choose_runtime

log = logging.getLogger("levers9.worker")

HEARTBEAT_EVERY_S = 2.0
MONITOR_EVERY_S = 1.0


@dataclass
class Running:
    container_id: str
    workspace: str
    deployment_id: str
    correlation_id: str
    keep_warm_seconds: int
    started_at: float
    address: str = ""
    ready_at: float | None = None
    stopping: bool = False
    task: asyncio.Task | None = field(default=None, repr=False)
    spec: dict = field(default_factory=dict, repr=False)
    deployment_version: int = 0
    restored_from: str = ""
    memory_mib: int = 0


class NotYet(Exception):
    """The projection has not caught up with this delivery yet: nak, and it comes back."""


def log_tail(path: Path, lines: int = 12) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])[-1500:]


class WorkerService(Service):
    name = "worker"
    projections = (ContainersView(), DeploymentsView(), SecretsView(), WorkersView(), CheckpointsView())

    def __init__(self, settings) -> None:
        super().__init__(settings)
        self.state_dir = self.settings.home_path / "workers" / self.worker_id
        self.runtime = None
        self.runtime_note = ""
        self.ready = asyncio.Event()
        self.containers: dict[str, Running] = {}
        self.prepare_error = ""
        self.criu_note = "not checked"
        self.cache = NodeCache(Path(self.settings.image_cache) / "blobs", self.settings, self.settings.cache_max_bytes)
        self.cache_url = f"http://{self.settings.http_host}:{self.settings.cache_port}"
        self.dumping: set[str] = set()

    @property
    def worker_id(self) -> str:
        return self.settings.worker_id or socket.gethostname().split(".")[0]

    # ---- lifecycle -----------------------------------------------------------------------------

    async def on_start(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.runtime, self.runtime_note = choose_runtime(self.settings, self.state_dir)
        log.info("worker %s: %s", self.worker_id, self.runtime_note)

    def background(self):
        return [self.prepare_and_register, self.heartbeat, self.monitor, self.serve_cache]

    async def serve_cache(self, stop: asyncio.Event) -> None:
        """The node content cache; the first worker of a node serves it, the others share it."""
        import uvicorn

        from levers9.runtime.service import _Server
        server = _Server(uvicorn.Config(cache_app(self.cache), host=self.settings.http_host,
                                        port=self.settings.cache_port, log_config=None, access_log=False,
                                        lifespan="off"))
        task = asyncio.create_task(server.serve())
        await asyncio.wait([task, asyncio.create_task(stop.wait())], return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            log.info("node cache: %s is served by another worker of this node", self.cache_url)
            return
        server.should_exit = True
        await task

    async def prepare_and_register(self, stop: asyncio.Event) -> None:
        """Preparing runc's base root fs can take minutes the first time on a machine: health stays
        green meanwhile, and the worker registers (so it gets work) only when it is ready."""
        try:
            await self.runtime.prepare(progress=lambda msg: log.info("prepare: %s", msg))
            leftovers = await self.runtime.cleanup_all()
            if leftovers:
                log.warning("removed %d containers left by a previous run: %s", len(leftovers), leftovers)
            self.criu_note = await checkpointing.enable_criu(self.runtime, self.settings)
            log.info("checkpoint/restore: %s", self.criu_note)
        except Exception as exc:  # noqa: BLE001 - reported on /healthz and in the log
            self.prepare_error = f"{type(exc).__name__}: {exc}"
            log.exception("runtime %s could not be prepared", self.runtime.name)
            return
        s = self.settings
        registered = E.WorkerRegistered(
            worker_id=self.worker_id, pool=s.worker_pool,
            cpu_millicores=s.worker_cpu_millicores or (os.cpu_count() or 1) * 1000,
            memory_mib=s.worker_memory_mib or psutil.virtual_memory().total // (1 << 20),
            features=list(self.runtime.features) + (["criu"] if checkpointing.ready(self.runtime) else []),
            address=f"http://{s.http_host}:{s.http_port}")
        env = envelope(registered, workspace="_sys")
        await self.bus.publish(env)
        await self.bus.publish(envelope(E.WorkerReady(worker_id=self.worker_id), workspace="_sys",
                                        correlation_id=env.correlation_id, causation_id=env.id))
        self.ready.set()
        log.info("worker %s registered with %s", self.worker_id, registered.features)

    def reactions(self):
        return [WorkConsumer(self.bus, f"worker-{self.worker_id}",
                             ["levers9.*.container.*.ContainerScheduled", "levers9.*.container.*.ContainerStopRequested",
                              "levers9.*.container.*.ContainerCheckpointRequested"],
                             handle=self.on_container_event, max_deliver=50, ack_wait=60)]

    async def on_stop(self) -> None:
        for c in list(self.containers.values()):
            await self.stop_container(c, "worker stopping")
        try:
            kv = await self.bus.heartbeats()
            await kv.delete(self.worker_id)
        except Exception:  # noqa: BLE001 - the TTL removes it anyway
            pass

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
        ev = d.message.event
        if isinstance(ev, E.ContainerStopRequested):
            c = self.containers.get(ev.container_id)
            if c is not None:
                await self.stop_container(c, ev.reason or "stop requested")
            return
        if isinstance(ev, E.ContainerCheckpointRequested):
            c = self.containers.get(ev.container_id)
            if c is not None and c.ready_at is not None:
                asyncio.create_task(self.checkpoint(c, manual=True))
            return
        if ev.worker_id != self.worker_id or ev.container_id in self.containers:
            return
        await self.ready.wait()
        row = await self.projected(d.message.envelope.workspace, ev.container_id, d.seq)
        if row is None:
            raise NotYet(f"container {ev.container_id} not projected yet")
        if row["worker_id"] != self.worker_id or row["status"] != "scheduled":
            log.info("placement of %s is stale (%s on %s); skipping", ev.container_id, row["status"], row["worker_id"])
            return
        if not row["deployment_id"]:
            c = Running(ev.container_id, row["workspace"], "", row["correlation_id"], 0, time.time())
            await self.finish(c, Exit(None, "nothing to run: the request names no deployment"), failed=True)
            return
        dep = await self.pool.fetchrow("SELECT * FROM worker.deployments WHERE workspace=$1 AND deployment_id=$2",
                                       row["workspace"], row["deployment_id"])
        if dep is None:
            raise NotYet(f"deployment {row['deployment_id']} not projected yet")
        spec = json.loads(dep["spec"])
        checkpoint = None
        if ev.checkpoint_id:
            checkpoint = await self.pool.fetchrow("SELECT * FROM worker.checkpoints WHERE workspace=$1 AND "
                                                  "checkpoint_id=$2", row["workspace"], ev.checkpoint_id)
            if checkpoint is None:
                raise NotYet(f"checkpoint {ev.checkpoint_id} not projected yet")
        c = Running(ev.container_id, row["workspace"], row["deployment_id"], row["correlation_id"],
                    int(spec.get("keep_warm_seconds", 60)), time.time(), spec=spec,
                    deployment_version=dep["version"], memory_mib=row["memory_mib"])
        self.containers[c.container_id] = c
        c.task = asyncio.create_task(self.start_container(c, row, spec, checkpoint))

    async def projected(self, workspace: str, container_id: str, seq: int, wait_s: float = 3.0):
        """Our own projection's row for the container once it has applied `seq`: the placement
        usually arrives here a few ms before the projection has it; waiting beats a nak's delay."""
        deadline = time.monotonic() + wait_s
        while True:
            row = await self.pool.fetchrow("SELECT * FROM worker.containers WHERE workspace=$1 AND container_id=$2",
                                           workspace, container_id)
            if row is not None and row["last_seq"] >= seq:
                return row
            if time.monotonic() > deadline:
                return None
            await asyncio.sleep(0.005)

    async def start_container(self, c: Running, row, spec: dict, checkpoint=None) -> None:
        note = ""
        try:
            code_dir = await self.fetch_code(c, spec)
            cspec = ContainerSpec(container_id=c.container_id, code_dir=code_dir,
                                  sdk_dir=Path(levers9.__file__).resolve().parent.parent,
                                  env=await self.container_env(c, spec),
                                  cpu_millicores=row["cpu_millicores"], memory_mib=row["memory_mib"])
        except Exception as exc:  # noqa: BLE001 - every failure becomes ContainerFailed with its reason
            log.exception("container %s could not start", c.container_id)
            await self.finish(c, Exit(None, f"could not start: {type(exc).__name__}: {exc}"), failed=True)
            return
        if checkpoint is not None:
            started, note = await self.restore(c, cspec, checkpoint)
            if started is not None:
                c.restored_from = checkpoint["checkpoint_id"]
                await self.emit(c, E.ContainerStarted(container_id=c.container_id, worker_id=self.worker_id,
                                                      restored_from=c.restored_from, note=note))
                await self.wait_ready(c, started.address, float(spec.get("timeout_seconds", 180)))
                return
        try:
            started = await self.runtime.start(cspec)
        except Exception as exc:  # noqa: BLE001
            log.exception("container %s could not start", c.container_id)
            await self.finish(c, Exit(None, f"could not start: {type(exc).__name__}: {exc}"), failed=True)
            return
        await self.emit(c, E.ContainerStarted(container_id=c.container_id, worker_id=self.worker_id, note=note))
        await self.wait_ready(c, started.address, float(spec.get("timeout_seconds", 180)))

    async def container_env(self, c: Running, spec: dict) -> dict[str, str]:
        return {**spec.get("env", {}), **await self.secret_env(c.workspace, spec.get("secrets", [])),
                "LEVERS9_RUNNER_MODULE": spec.get("module", ""), "LEVERS9_RUNNER_HANDLER": spec.get("handler", ""),
                "LEVERS9_RUNNER_KIND": spec.get("kind", "endpoint"), "LEVERS9_RUNNER_ON_START": spec.get("on_start", ""),
                "LEVERS9_RUNNER_CONCURRENCY": str(spec.get("concurrency", 1)),
                "LEVERS9_RUNNER_TIMEOUT": str(spec.get("timeout_seconds", 180)),
                "LEVERS9_RUNNER_MAX_BODY": str(self.settings.max_body_bytes),
                "LEVERS9_CONTAINER_ID": c.container_id, "LEVERS9_DEPLOYMENT_ID": c.deployment_id}

    async def restore(self, c: Running, cspec: ContainerSpec, checkpoint) -> tuple[object | None, str]:
        """Restore from the node cache (filled from S3 on a miss, hash verified). On any failure the
        checkpoint is marked restore_failed and the container starts cold (the caller does that)."""
        ck = checkpoint["checkpoint_id"]
        try:
            started = await checkpointing.restore(self.runtime, cspec, checkpoint, self.cache_url, self.cache)
            return started, f"restored from {ck}"
        except Exception as exc:  # noqa: BLE001 - a failed restore is never fatal: cold start instead
            reason = f"{type(exc).__name__}: {exc}"
            log.warning("restore of %s from %s failed, starting cold: %s", c.container_id, ck, reason)
            await self.emit(c, E.CheckpointFailed(checkpoint_id=ck, stage="restore", reason=reason,
                                                  deployment_id=c.deployment_id, worker_id=self.worker_id))
            return None, f"cold: restore of {ck} failed: {reason}"[:500]

    async def checkpoint(self, c: Running, manual: bool = False) -> None:
        """Dump a ready container leave-running, at most one dump per deployment version at a time."""
        if c.deployment_id in self.dumping:
            return
        self.dumping.add(c.deployment_id)
        try:
            claim = await self.claim_checkpoint(c, manual)
            if claim is None:
                return
            try:
                dumped = await checkpointing.dump(self.runtime, c.container_id, self.cache, self.settings,
                                                  c.memory_mib)
            except Exception as exc:  # noqa: BLE001 - skipped and recorded with the reason
                log.warning("checkpoint of %s skipped: %s", c.container_id, exc)
                await self.emit(c, E.CheckpointFailed(checkpoint_id=claim, stage="dump", reason=str(exc)[:1000],
                                                      deployment_id=c.deployment_id, worker_id=self.worker_id))
                return
            await self.emit(c, E.CheckpointDumped(
                checkpoint_id=claim, deployment_id=c.deployment_id, deployment_version=c.deployment_version,
                container_id=c.container_id, worker_id=self.worker_id, accelerator="", runtime=self.runtime.name,
                size_bytes=dumped.size_bytes, sha256=dumped.sha256,
                location=f"{self.cache_url}/blobs/{dumped.sha256}"))
            log.info("checkpoint %s of %s: %d bytes in %.2f s", claim, c.container_id, dumped.size_bytes,
                     dumped.seconds)
        finally:
            self.dumping.discard(c.deployment_id)

    async def claim_checkpoint(self, c: Running, manual: bool) -> str | None:
        dep = await self.pool.fetchrow("SELECT last_seq, checkpoint_claim FROM worker.deployments WHERE workspace=$1 "
                                       "AND deployment_id=$2", c.workspace, c.deployment_id)
        if dep is None:
            return None
        if not manual:
            live = await self.pool.fetchval(
                "SELECT count(*) FROM worker.checkpoints WHERE workspace=$1 AND deployment_id=$2 "
                "AND status IN ('dumped', 'available')", c.workspace, c.deployment_id)
            claimed = dep["checkpoint_claim"] and await self.pool.fetchval(
                "SELECT status FROM worker.checkpoints WHERE workspace=$1 AND checkpoint_id=$2",
                c.workspace, dep["checkpoint_claim"]) is None
            if live or claimed:
                return None  # there is one, or another worker is dumping it now
        checkpoint_id = uuid7()
        try:
            await self.bus.append(envelope(E.DeploymentCheckpointClaimed(
                deployment_id=c.deployment_id, checkpoint_id=checkpoint_id, worker_id=self.worker_id,
                container_id=c.container_id), workspace=c.workspace, correlation_id=c.correlation_id), dep["last_seq"])
        except ConcurrencyConflict:
            return None  # another worker claimed it first
        return checkpoint_id

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
                    if r.status_code == 200:
                        c.address, c.ready_at = address, time.time()
                        await self.emit(c, E.ContainerReady(container_id=c.container_id, worker_id=self.worker_id,
                                                            address=address))
                        if c.spec.get("checkpoint_enabled") and not c.restored_from and self.can_checkpoint(c):
                            asyncio.create_task(self.checkpoint(c))
                        return
                    if r.status_code == 500:
                        error = r.json().get("error", "the app failed to start")
                        await self.stop_container(c, f"app failed to start: {error}", failed=True)
                        return
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.02)
        if not c.stopping:
            await self.stop_container(c, f"not ready within {timeout:.0f} s", failed=True)

    def can_checkpoint(self, c: Running) -> bool:
        """Preconditions, checked: CRIU works here, and the container holds at most one GPU."""
        return checkpointing.ready(self.runtime) and int(c.spec.get("gpu_count", 0)) <= 1

    async def fetch_code(self, c: Running, spec: dict) -> Path:
        sha = spec.get("code_sha256", "")
        target = self.state_dir / "code" / sha
        if sha and target.is_dir():
            return target
        url = f"{self.settings.gateway_url}/api/v1/internal/deployments/{c.deployment_id}/code"
        async with httpx.AsyncClient(timeout=30) as client:
            r = await client.get(url, params={"workspace": c.workspace, "container_id": c.container_id},
                                 headers={"Authorization": f"Bearer {self.settings.worker_token}"})
        if r.status_code != 200:
            raise RuntimeError(f"code archive not available ({r.status_code}): {r.text[:300]}")
        tmp = target.with_name(target.name + f".tmp{os.getpid()}")
        tmp.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(r.content), mode="r:gz") as tar:
            tar.extractall(tmp, filter="data")  # refuses absolute paths and .. (PEP 706)
        os.chmod(tmp, 0o755)
        try:
            tmp.rename(target)
        except OSError:  # extracted concurrently by another start of the same code
            pass
        return target

    async def secret_env(self, workspace: str, names: list[str]) -> dict[str, str]:
        if not names:
            return {}
        rows = await self.pool.fetch("SELECT name, ciphertext FROM worker.secrets WHERE workspace=$1 AND name = ANY($2)",
                                     workspace, names)
        found = {r["name"]: decrypt(self.settings.secret_key, r["ciphertext"]) for r in rows}
        missing = sorted(set(names) - set(found))
        if missing:
            raise RuntimeError(f"secret(s) {', '.join(missing)} not found in workspace {workspace!r}: "
                               f"create with `levers9 secret create NAME VALUE`")
        return found

    # ---- stopping ------------------------------------------------------------------------------

    async def stop_container(self, c: Running, reason: str, failed: bool = False) -> None:
        if c.stopping:
            return
        c.stopping = True
        try:
            ended = await self.runtime.stop(c.container_id)
        except Exception as exc:  # noqa: BLE001
            ended = Exit(None, f"stop failed: {exc}")
        if ended.oom:
            reason, failed = ended.reason, True
        await self.finish(c, Exit(ended.code, reason, ended.oom), failed=failed)

    async def finish(self, c: Running, ended: Exit, failed: bool) -> None:
        self.containers.pop(c.container_id, None)
        if failed:
            tail = log_tail(self.runtime.log_path(c.container_id))
            reason = ended.reason + (f"; log: {tail}" if tail and tail not in ended.reason else "")
            if not c.stopping:
                try:
                    await self.runtime.stop(c.container_id)
                except Exception:  # noqa: BLE001 - best effort cleanup
                    pass
            await self.emit(c, E.ContainerFailed(container_id=c.container_id, worker_id=self.worker_id,
                                                 exit_code=ended.code, reason=reason))
        else:
            await self.emit(c, E.ContainerStopped(container_id=c.container_id, worker_id=self.worker_id,
                                                  exit_code=ended.code or 0, reason=ended.reason))

    async def emit(self, c: Running, event: E.Event) -> None:
        await self.bus.publish(envelope(event, workspace=c.workspace, correlation_id=c.correlation_id))

    async def monitor(self, stop: asyncio.Event) -> None:
        async with httpx.AsyncClient(timeout=1.0) as client:
            while not stop.is_set():
                await _sleep(stop, MONITOR_EVERY_S)
                draining = await self.draining()
                for c in list(self.containers.values()):
                    if c.stopping or c.ready_at is None or c.deployment_id in self.dumping:
                        continue  # never stop a container in the middle of its dump
                    try:
                        await self.check(client, c, draining)
                    except Exception:  # noqa: BLE001 - next round checks again
                        log.exception("checking %s failed", c.container_id)

    async def check(self, client: httpx.AsyncClient, c: Running, draining: bool) -> None:
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
        # a restored runner remembers the requests of the container it was dumped from: idle time
        # counts from this container's own ready time at the earliest
        last = max(status.get("last_request_at") or 0, c.ready_at)
        if status.get("inflight", 0) == 0 and time.time() - last >= c.keep_warm_seconds:
            await self.stop_container(c, f"idle for {c.keep_warm_seconds} s (scale to zero)")

    async def draining(self) -> bool:
        try:
            return bool(await self.pool.fetchval("SELECT draining FROM worker.workers WHERE worker_id=$1",
                                                 self.worker_id))
        except Exception:  # noqa: BLE001
            return False

    # ---- HTTP ----------------------------------------------------------------------------------

    def routes(self, app: FastAPI) -> None:
        @app.get("/containers")
        async def containers() -> list[dict]:
            return [{"container_id": c.container_id, "workspace": c.workspace, "deployment_id": c.deployment_id,
                     "address": c.address, "ready": c.ready_at is not None} for c in self.containers.values()]

        @app.get("/containers/{container_id}/logs")
        async def logs(container_id: str, follow: bool = False):
            path = self.runtime.log_path(container_id)
            if not path.exists():
                raise HTTPException(404, f"no log for container {container_id!r} on worker {self.worker_id}")
            if not follow:
                return PlainTextResponse(path.read_text(errors="replace"))
            return StreamingResponse(_follow(path, lambda: container_id in self.containers), media_type="text/plain")

    async def health_detail(self) -> dict:
        return {"worker_id": self.worker_id, "runtime": self.runtime.name if self.runtime else "",
                "runtime_note": self.runtime_note, "registered": self.ready.is_set(), "criu": self.criu_note,
                "prepare_error": self.prepare_error, "containers": len(self.containers)}


async def _follow(path: Path, alive):
    with path.open("rb") as f:
        while True:
            chunk = f.read(65536)
            if chunk:
                yield chunk
                continue
            if not alive():
                return
            await asyncio.sleep(0.3)


async def _sleep(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    except asyncio.TimeoutError:
        pass
