"""The dashboard's FastAPI app, put together: sessions, the pass-through and actions, the composed
views, `/events`, `/mcp`, WebSockets, notebooks (`/nb/`), the web app, `/healthz` and `/metrics`.

`/mcp` is routed before FastAPI sees it: only a bearer token of a workspace gets through (no
cookie: an agent is not a browser), then the SDK's streamable-HTTP app answers. Every request runs
with a correlation id (the caller's `X-Correlation-Id`, else a new one) in the logs.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Histogram, generate_latest
from starlette.types import ASGIApp, Receive, Scope, Send

from levers9.runtime.telemetry import correlation_id

from . import mcp_tools, routes_events, routes_notebooks, routes_proxy, routes_session, routes_views, routes_websockets
from .auth import NOT_SIGNED_IN, Refused, caller
from .fanout import CLIENT_QUEUE, KEEPALIVE_S, LINGER_S, RING, Hubs
from .sessions import TICKET_TTL_S, Sealer, Tickets, load_key
from .site import WEB_OUT, Site
from .upstream import GatewayDown, Upstream

log = logging.getLogger("levers9.dashboard")

REQUESTS = Counter("levers9_dashboard_requests_total", "HTTP requests answered", ["kind", "status"])
SECONDS = Histogram("levers9_dashboard_request_seconds", "Time to the response's start", ["kind"])


@dataclass
class Config:
    gateway_url: str
    home: Path
    web_out: Path = WEB_OUT
    ticket_ttl_s: float = TICKET_TTL_S
    ring: int = RING
    client_queue: int = CLIENT_QUEUE
    linger_s: float = LINGER_S
    keepalive_s: float = KEEPALIVE_S


def kind_of(path: str) -> str:
    for prefix, kind in (("/api/v1/", "passthrough"), ("/api/", "api"), ("/events", "events"), ("/mcp", "mcp"),
                         ("/healthz", "health"), ("/metrics", "metrics"), ("/nb/", "notebook")):
        if path.startswith(prefix):
            return kind
    return "page"


class Front:
    """The outermost ASGI layer: correlation id, metrics, and `/mcp` behind its bearer check."""

    def __init__(self, app: FastAPI, mcp_app: ASGIApp) -> None:
        self.app = app
        self.mcp_app = mcp_app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        correlation_id.set(headers.get(b"x-correlation-id", b"").decode(errors="replace")[:100] or str(uuid.uuid4()))
        path = scope["path"]
        kind = kind_of(path)
        started = time.monotonic()
        status = {"code": 0}

        async def sending(message: Any) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                SECONDS.labels(kind).observe(time.monotonic() - started)
            await send(message)

        try:
            if path == "/mcp" or path.startswith("/mcp/"):
                await self.mcp(scope, receive, sending)
            else:
                await self.app(scope, receive, sending)
        finally:
            REQUESTS.labels(kind, str(status["code"])).inc()

    async def mcp(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope)
        request.scope["app"] = self.app
        try:
            who = await caller(request, cookie=False)
        except GatewayDown as exc:
            await JSONResponse({"detail": str(exc)}, status_code=502)(scope, receive, send)
            return
        if who is None:
            await JSONResponse({"detail": "send Authorization: Bearer <a token of your workspace>"}, status_code=401,
                               headers={"WWW-Authenticate": "Bearer"})(scope, receive, send)
            return
        await self.mcp_app({**scope, "path": "/", "raw_path": b"/", "root_path": ""}, receive, send)


def create(config: Config) -> tuple[Front, FastAPI]:
    """(the ASGI app to serve, the FastAPI app inside it); start it with `running(app)`."""
    app = FastAPI(title="levers9 dashboard", version="0.1.0", docs_url=None, redoc_url=None, openapi_url=None)
    upstream = Upstream(config.gateway_url)
    app.state.config = config
    app.state.upstream = upstream
    app.state.sealer = Sealer(load_key(config.home))
    app.state.tickets = Tickets(config.ticket_ttl_s)
    app.state.hubs = Hubs(upstream, ring=config.ring, client_queue=config.client_queue, linger_s=config.linger_s)
    app.state.keepalive_s = config.keepalive_s
    app.state.started_at = time.time()
    site = Site(config.web_out)
    app.state.mcp = mcp_tools.build(upstream)
    mcp_app = mcp_tools.asgi(app.state.mcp)

    @app.exception_handler(Refused)
    async def refused(_: Request, exc: Refused) -> JSONResponse:
        return JSONResponse({"detail": exc.detail}, status_code=exc.status)

    @app.exception_handler(GatewayDown)
    async def gateway_down(_: Request, exc: GatewayDown) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=502)

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        """The dashboard answers; whether the gateway does is said, not required (it may start later)."""
        try:
            r = await upstream.http.get(f"{upstream.base_url}/healthz", timeout=2.0)
            gateway = "ok" if r.status_code == 200 else f"answered {r.status_code}"
        except Exception as exc:  # noqa: BLE001 - health reports, never raises
            gateway = f"error: {type(exc).__name__}"
        hubs: Hubs = app.state.hubs
        return {"service": "dashboard", "healthy": True, "checks": {"gateway": gateway},
                "uptime_s": round(time.time() - app.state.started_at, 1), "web_app_built": site.built,
                "event_streams": sum(1 for h in hubs.by_workspace.values() if h.task is not None),
                "sse_clients": sum(len(h.clients) for h in hubs.by_workspace.values())}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    for module in (routes_session, routes_views, routes_proxy, routes_events, routes_websockets, routes_notebooks):
        app.include_router(module.router)

    # HEAD too: Next's client checks the current URL with one after a failed fetch
    @app.api_route("/{path:path}", methods=["GET", "HEAD"], include_in_schema=False)
    async def pages(path: str, request: Request) -> Response:
        return await site.serve(path, request)

    @app.api_route("/{path:path}", methods=["POST", "PUT", "PATCH", "DELETE"], include_in_schema=False)
    async def no_route(path: str, request: Request) -> Response:
        if await caller(request) is None:
            return JSONResponse({"detail": NOT_SIGNED_IN}, status_code=401)
        return JSONResponse({"detail": f"no route {request.method} /{path}"}, status_code=404)

    return Front(app, mcp_app), app


@contextlib.asynccontextmanager
async def running(app: FastAPI) -> AsyncIterator[None]:
    """What must run beside the HTTP server: the MCP session manager; closed on the way out."""
    async with app.state.mcp.session_manager.run():
        try:
            yield
        finally:
            await app.state.hubs.close()
            await app.state.upstream.close()
