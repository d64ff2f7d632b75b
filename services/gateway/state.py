"""The gateway's process state: its projections and the in-memory routing state they feed.

The container events the gateway projects drive one DeploymentRouter per deployment (router.py):
which containers are live, which are ready and where. Tokens and resolved deployments are cached
here and dropped whenever their projection applies a batch. The HTTP routes (routes_*.py) reach
this object through `deps.Gateway`.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
from dataclasses import dataclass
from typing import Any

import aiohttp
import httpx
import msgspec

from levers9.contracts import envelope
from levers9.contracts import events as E
from levers9.contracts.spec import DeploymentSpec, spec_from_builtins
from levers9.runtime.bus import Appended
from levers9.runtime.consumer import Delivery
from levers9.runtime.projection import Projection
from levers9.runtime.service import Service
from levers9.runtime.views import (
    CONTAINER_STATUS,
    CheckpointsView,
    ContainersView,
    DeploymentsView,
    ImageBuildsView,
    SecretsView,
    TokensView,
    WorkersView,
    foreign_report,
)
from levers9.runtime.views_volumes import VolumesView

from .callers import Caller
from .endpoint_meter import EndpointMeter
from .router import DeploymentRouter

log = logging.getLogger("levers9.gateway")

TERMINAL = ("stopped", "failed")


@dataclass(frozen=True)
class Deployment:
    """A row of gateway.deployments with its spec decoded."""
    workspace: str
    deployment_id: str
    name: str
    version: int
    status: str
    spec: DeploymentSpec

    @classmethod
    def from_row(cls, row: Any) -> Deployment:
        return cls(workspace=row["workspace"], deployment_id=row["deployment_id"], name=row["name"],
                   version=row["version"], status=row["status"], spec=spec_from_builtins(json.loads(row["spec"])))


@dataclass(frozen=True)
class RouteUpdate:
    status: str
    address: str
    reason: str
    restored: bool = False


def route_update(ev: E.Event) -> RouteUpdate | None:
    """What a container event tells a deployment's router; None for an event that changes no status."""
    status = CONTAINER_STATUS.get(type(ev).__name__)
    if status is None:
        return None
    return RouteUpdate(status, getattr(ev, "address", ""), getattr(ev, "reason", ""),
                       bool(getattr(ev, "restored_from", "")))


class Gateway(Service):
    name = "gateway"
    projections = (TokensView(), DeploymentsView(), ContainersView(), WorkersView(), SecretsView(), CheckpointsView(),
                   ImageBuildsView(), VolumesView())
    http: httpx.AsyncClient  # set by on_start
    session: aiohttp.ClientSession  # set by on_start

    def __init__(self, settings) -> None:
        super().__init__(settings)
        self.routers: dict[str, DeploymentRouter] = {}
        self.router_loads: dict[str, asyncio.Task[None]] = {}  # routers whose live containers are being read
        self.container_deployment: dict[str, str] = {}  # live containers -> their deployment
        self.container_worker: dict[str, str] = {}  # live containers -> the worker they are placed on
        self.tokens: dict[str, Caller] = {}  # token sha256 -> caller
        self.deployments: dict[tuple[str, str, str], Deployment] = {}  # (workspace, name, vN|latest)
        self.background_tasks: set[asyncio.Task] = set()  # spawned calls: referenced until done
        self.functions: Any = None  # functions_grpc.Functions, once its server is up
        self.grpc_port = 0
        self.meter = EndpointMeter()  # proxied endpoint calls, flushed by endpoint_store.run

    async def on_start(self) -> None:
        self.http = httpx.AsyncClient(timeout=None, limits=httpx.Limits(max_connections=2000,
                                                                         max_keepalive_connections=500))
        # the proxy hop: aiohttp's pool hands out a keep-alive connection without scanning the pool
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=60),
            auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None), skip_auto_headers=("User-Agent",))
        for r in await self.pool.fetch("SELECT container_id, workspace, deployment_id, worker_id, "
                                       "COALESCE(request->>'session_id', '') AS session_id FROM gateway.containers "
                                       "WHERE status NOT IN ('stopped', 'failed')"):
            self.container_deployment[r["container_id"]] = container_route(r["workspace"], r["deployment_id"],
                                                                           r["session_id"])
            self.container_worker[r["container_id"]] = r["worker_id"]

    async def on_stop(self) -> None:
        await self.http.aclose()
        await self.session.close()

    # ---- projections feed the in-memory routing state --------------------------------------------

    async def apply(self, p: Projection, batch: list[Delivery]) -> None:
        await super().apply(p, batch)
        if p.name == "tokens":
            self.tokens.clear()
        elif p.name == "deployments":
            self.deployments.clear()
            for d in batch:  # a router holds its max_containers: a scaled deployment's changes now
                if d.message is not None and isinstance(d.message.event, E.DeploymentScaled):
                    self.rescaled(d.message.envelope.workspace, d.message.event)
        elif p.name == "containers":
            for d in batch:
                if d.message is not None:
                    await self.route_event(d.message.event, d.message.envelope.workspace)

    def rescaled(self, workspace: str, ev: E.DeploymentScaled) -> None:
        router = self.routers.get(route_key(workspace, ev.deployment_id))
        if router is not None and ev.max_containers is not None:
            router.max_containers = ev.max_containers

    async def route_event(self, ev: E.Event, workspace: str) -> None:
        if isinstance(ev, E.ContainerRequested):  # a session's sandbox is mapped to its session's router first
            self.container_deployment.setdefault(ev.container_id,
                                                 container_route(workspace, ev.deployment_id, ev.session_id))
        container_id = getattr(ev, "container_id", "")
        if foreign_report(self.container_worker.get(container_id, ""), ev):
            log.warning("ignored %s of container %s from worker %s: it is placed on %s", type(ev).__name__,
                        container_id, getattr(ev, "worker_id", ""), self.container_worker.get(container_id))
            return
        if isinstance(ev, (E.ContainerRequested, E.ContainerScheduled)):
            self.container_worker[container_id] = getattr(ev, "worker_id", "")
        update = route_update(ev)
        if update is None:
            return
        router = self.routers.get(self.container_deployment.get(container_id, ""))
        if update.status in TERMINAL:  # a re-request (a lost worker's container) adds it back
            self.container_deployment.pop(container_id, None)
            self.container_worker.pop(container_id, None)
        if router is not None:
            await router.update(container_id, update.status, update.address, update.reason, update.restored)

    def sample_queues(self) -> None:
        """Give the meter each deployment's wait-queue peak since the last sample (the queue-depth chart).
        Sessions' routers (keyed `session:`) are one caller's own: they are no deployment's queue."""
        now = dt.datetime.now(dt.timezone.utc)
        for key, router in list(self.routers.items()):
            workspace, sep, deployment_id = key.partition("/")
            if sep and deployment_id == router.deployment_id:
                self.meter.queued(workspace, deployment_id, router.take_peak(), now)

    async def router_for(self, dep: Deployment) -> DeploymentRouter:
        """The one router of a deployment version. It is registered before anything is awaited, so
        concurrent first calls share it (each used to build its own while the database answered: the
        orphans never heard of their containers, and each asked for more, past max_containers), and
        the container events that arrive while its live containers are read reach it."""
        key = route_key(dep.workspace, dep.deployment_id)
        router = self.routers.get(key)
        if router is None:
            scaling = dep.spec.scaling
            router = self.routers[key] = DeploymentRouter(dep.deployment_id, scaling.concurrency,
                                                          scaling.max_containers, max_queue=scaling.max_pending)
            router.begin_loading()
            task = self.router_loads[key] = asyncio.create_task(self.load_router(key, router, dep))
            task.add_done_callback(lambda t: self.router_loads.pop(key) if self.router_loads.get(key) is t else None)
        loading = self.router_loads.get(key)
        if loading is not None:
            await asyncio.shield(loading)  # a caller that gives up does not stop the load for the others
        return router

    async def load_router(self, key: str, router: DeploymentRouter, dep: Deployment) -> None:
        try:
            rows = await self.pool.fetch(
                "SELECT container_id, status, address FROM gateway.containers WHERE workspace=$1 AND deployment_id=$2 "
                "AND status NOT IN ('stopped', 'failed')", dep.workspace, dep.deployment_id)
        except BaseException:
            if self.routers.get(key) is router:  # the next call tries again
                del self.routers[key]
            raise
        # a session's sandbox is its session's alone
        await router.loaded([(r["container_id"], r["status"], r["address"]) for r in rows
                             if not self.container_deployment.get(r["container_id"], "").startswith("session:")])

    async def publish(self, event: E.Event, workspace: str,
                      correlation_id: str | None = None) -> tuple[Any, Appended]:
        env = envelope(event, workspace=workspace, correlation_id=correlation_id)
        return env, await self.bus.publish(env)


def route_key(workspace: str, deployment_id: str) -> str:
    """A deployment's router: deployment ids (`<name>-v<N>`) repeat across workspaces, so a router keyed
    by the id alone sent one workspace's calls to another's containers of the same name."""
    return f"{workspace}/{deployment_id}"


def container_route(workspace: str, deployment_id: str, session_id: str) -> str:
    """The router a container serves: its session's (`session:<id>`, on the gateway that holds the
    session; none elsewhere, so another gateway never lends it to the deployment's calls), or its
    deployment's."""
    return f"session:{session_id}" if session_id else route_key(workspace, deployment_id)


def row_json(record: Any, *jsonb: str) -> dict[str, Any]:
    """A row as JSON-ready builtins; the named jsonb columns (stored as text) become objects."""
    out = msgspec.to_builtins(dict(record))
    for column in jsonb:
        if isinstance(out.get(column), str):
            out[column] = json.loads(out[column])
    return out
