"""The gateway process: the REST API under /api/v1 and invocation at /endpoint/{name}.

The shell only: state.py holds the projections and the routing state they feed; each resource's
routes are an APIRouter of their own (routes_*.py) and reach that state through `deps.Gateway`;
auth.py says who is calling; router.py holds calls until a container is ready; proxy.py forwards
them. Objects of another workspace answer 404, never 403, so their existence does not leak.
"""

from __future__ import annotations

from fastapi import FastAPI

from levers9.runtime import juicefs
from levers9.runtime.views_clusters import ClustersView

from . import (
    endpoint_store,
    load_report,
    routes_boxes,
    routes_calls,
    routes_catalogues,
    routes_checkpoints,
    routes_clusters,
    routes_containers,
    routes_deployments,
    routes_events,
    routes_functions,
    routes_images,
    routes_internal,
    routes_invoke,
    routes_sandboxes,
    routes_scaling,
    routes_stats,
    routes_tasks,
    routes_tokens,
    routes_volumes,
    routes_websockets,
    routes_workers,
    sandbox_store,
)
from .body_limits import BodyLimits
from .errors import install as install_error_handlers
from .functions_grpc import serve as serve_functions
from .openapi_docs import document
from .state import Gateway
from .task_runner import TaskRunner
from .views_events import CallsView, EventsView
from .views_tasks import TasksView

# the calls' routes first: a request is matched against the routes in this order, and an endpoint's,
# a task's or a function's call is most of the traffic (no path of theirs overlaps another module's)
ROUTERS = (routes_invoke, routes_tasks, routes_functions, routes_tokens, routes_catalogues, routes_scaling,
           routes_deployments, routes_images, routes_containers, routes_checkpoints, routes_workers, routes_internal,
           routes_volumes, routes_clusters, routes_events, routes_calls, routes_stats, routes_boxes, routes_websockets,
           routes_sandboxes)


class GatewayService(Gateway):
    # attached clusters (routes_clusters), the event index and the calls (routes_events, routes_calls);
    # state.Gateway's tuple type is narrower than Service's Sequence
    projections = (*Gateway.projections, ClustersView(), EventsView(), CallsView(), TasksView())  # type: ignore[assignment]

    def routes(self, app: FastAPI) -> None:
        app.state.gateway = self
        app.state.juicefs = self.juicefs = juicefs.Mount(self.settings, "gateway")  # volumes (routes_volumes)
        for module in ROUTERS:
            app.include_router(module.router)
        install_error_handlers(app)  # a server it needs is down: 503 with its name, not a bare 500
        # every body is held to its route's limit and a JSON body checked (depth, UTF-8) before a route runs
        app.add_middleware(BodyLimits, limits=lambda: {"code_limit": routes_deployments.MAX_CODE_BYTES,
                                                       "file_limit": routes_volumes.MAX_PUT_BYTES,
                                                       "call_limit": self.settings.gateway.max_body_bytes})
        document(app)  # every status code a route answers is in /openapi.json

    async def on_start(self) -> None:
        await super().on_start()
        await endpoint_store.setup(self.pool)  # the endpoint meter's tables: measurements, not projections

    async def on_stop(self) -> None:
        await super().on_stop()
        await self.juicefs.close()

    def background(self):
        return [*super().background(), lambda stop: serve_functions(self, stop),
                lambda stop: endpoint_store.run(self.pool, self.meter, stop, sample=self.sample_queues),
                lambda stop: load_report.run(self.bus.nc, self.routers, stop),
                lambda stop: sandbox_store.sweep(self, stop),  # sandboxes' lifetimes
                self.run_tasks]

    async def run_tasks(self, stop) -> None:
        """Task queues: this gateway's share of the durable task consumer (task_runner.py)."""
        self.tasks = TaskRunner(self)
        await self.tasks.run(stop)
