"""The composed views: the overview, a container's cold-start waterfall, a correlation id's chain.

Each asks the gateway with the caller's token (so the gateway scopes every answer to its
workspace, and another workspace's id is its 404) and hands the answers to a pure function
(views.py, waterfall.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from . import views
from .auth import Caller, Refused
from .routes_proxy import ID, signed_in
from .upstream import Upstream
from .waterfall import waterfall

router = APIRouter()

CHAIN_MAX = 5000  # events of one correlation id shown at most (pages of 1000)
LIVE_MAX = 10000  # live containers counted by state (the gateway's largest page)


def _ok(status: int, body: Any, what: str) -> Any:
    if status == 200:
        return body
    detail = body.get("detail") if isinstance(body, dict) else body
    raise Refused(status if status in (401, 403, 404) else 502, f"{what}: {detail}")


async def overview_of(upstream: Upstream, who: Caller) -> dict[str, Any]:
    """Four reads at once; the failures need the gateway's event index (an older gateway has none:
    the overview then says so instead of failing)."""
    t = who.token
    (ds, dbody, _), (ls, lbody, _), (ts, _, theaders), (ws, wbody, _), (fs, fbody, _) = await asyncio.gather(
        upstream.get_json(t, "/api/v1/deployments"),
        upstream.get_json(t, "/api/v1/containers", {"limit": LIVE_MAX}),
        upstream.get_json(t, "/api/v1/containers", {"all": "true", "limit": 1}),
        upstream.get_json(t, "/api/v1/workers"),
        upstream.get_json(t, "/api/v1/events", {"type": ",".join(views.FAILURE_TYPES), "limit": 20}))
    total = int(theaders.get("x-total-count") or 0) if ts == 200 else 0
    out = {"workspace": who.workspace,
           "deployments": views.deployments_view(_ok(ds, dbody, "deployments")),
           "containers": views.containers_view(_ok(ls, lbody, "containers"), total),
           **views.workers_view(_ok(ws, wbody, "workers")),
           "failures": views.failures_view(fbody) if fs == 200 and isinstance(fbody, list) else [],
           }
    if fs != 200:
        out["failures_note"] = f"the gateway's /api/v1/events answered {fs}: no failures listed"
    return out


@router.get("/api/overview")
async def overview(request: Request) -> Any:
    who = await signed_in(request)
    return await overview_of(request.app.state.upstream, who)


async def events_of(upstream: Upstream, token: str, params: dict[str, Any], most: int) -> list[dict[str, Any]]:
    """Every event matching `params`, newest first, paged back with `before`, at most `most`."""
    out: list[dict[str, Any]] = []
    before = None
    while len(out) < most:
        page = {**params, "limit": min(1000, most - len(out)), **({"before": before} if before else {})}
        status, body, headers = await upstream.get_json(token, "/api/v1/events", page)
        out += _ok(status, body, "events")
        before = headers.get("x-next-before")
        if not before or not body:
            break
    return out


async def waterfall_of(upstream: Upstream, who: Caller, container_id: str) -> dict[str, Any]:
    if not ID.match(container_id):
        raise Refused(404, f"no container {container_id!r}")
    status, container, _ = await upstream.get_json(who.token, f"/api/v1/containers/{container_id}")
    container = _ok(status, container, f"container {container_id}")
    own, calls = await asyncio.gather(
        events_of(upstream, who.token, {"aggregate": "container", "aggregate_id": container_id}, 2000),
        events_of(upstream, who.token, {"correlation_id": container.get("correlation_id", ""),
                                        "type": "FunctionCallStarted,FunctionCallFinished"}, 2000)
        if container.get("correlation_id") else asyncio.sleep(0, result=[]))
    return waterfall(container_id, [*own, *calls], first_answer_at=container.get("first_answer_at"))


@router.get("/api/containers/{container_id}/waterfall")
async def container_waterfall(container_id: str, request: Request) -> Any:
    who = await signed_in(request)
    return await waterfall_of(request.app.state.upstream, who, container_id)


async def chain_of(upstream: Upstream, who: Caller, correlation_id: str) -> dict[str, Any]:
    if not ID.match(correlation_id):
        raise Refused(404, f"no events with correlation id {correlation_id!r}")
    events = await events_of(upstream, who.token, {"correlation_id": correlation_id}, CHAIN_MAX)
    if not events:
        raise Refused(404, f"no events with correlation id {correlation_id!r} in workspace {who.workspace!r}")
    return views.chain(correlation_id, events)


@router.get("/api/chain/{correlation_id}")
async def correlation_chain(correlation_id: str, request: Request) -> Any:
    who = await signed_in(request)
    return await chain_of(request.app.state.upstream, who, correlation_id)


def refused_json(exc: Refused) -> JSONResponse:
    return JSONResponse({"detail": exc.detail}, status_code=exc.status)
