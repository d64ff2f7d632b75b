"""The gateway's read-only API passed through with the session's token, and the page's actions.

`GET /api/v1/<path>` goes to the gateway's `/api/v1/<path>` (query string kept, `X-Total-Count` and
`X-Next-Before` kept) only for the paths in ALLOWED: what the pages read, never a change, never an
internal route, and secrets by name only. Its status and body are the gateway's, so another
workspace's id answers the gateway's 404. Actions (`POST /api/...`) are the gateway's changes, each
behind the CSRF check.
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.background import BackgroundTask

from .auth import NOT_SIGNED_IN, Caller, Refused, caller, check_change
from .upstream import Upstream

router = APIRouter()

SEGMENT = r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,199}"
ALLOWED = [re.compile(f"^{p}$") for p in (
    "deployments", f"deployments/{SEGMENT}/stats", "containers", f"containers/{SEGMENT}",
    f"containers/{SEGMENT}/logs", "checkpoints", "images", f"images/{SEGMENT}", f"images/{SEGMENT}/events",
    "workers", "volumes", "secrets", "tokens", "calls", f"calls/{SEGMENT}", "events", "catalogues",
    "tasks", f"tasks/{SEGMENT}", "schedules", "whoami")]
KEPT_HEADERS = ("content-type", "x-total-count", "x-next-before", "cache-control")
SECRET_FIELDS = ("name", "updated_at", "created_at")  # never a value, whatever the gateway answers


def allowed(path: str) -> bool:
    return any(p.match(path) for p in ALLOWED)


async def signed_in(request: Request) -> Caller:
    who = await caller(request)
    if who is None:
        raise Refused(401, NOT_SIGNED_IN)
    return who


def gateway_json(status: int, body: Any, headers: Any = None) -> JSONResponse:
    kept = {k: v for k, v in (headers or {}).items() if k.lower() in ("x-total-count", "x-next-before")}
    return JSONResponse(body, status_code=status, headers=kept)


@router.get("/api/v1/{path:path}")
async def pass_through(path: str, request: Request) -> Response:
    who = await signed_in(request)
    if not allowed(path):
        return JSONResponse({"detail": f"/api/v1/{path} is not readable through the dashboard"}, status_code=404)
    upstream: Upstream = request.app.state.upstream
    if path == "secrets":  # names only: filtered here too, whatever the gateway's list holds
        status, body, headers = await upstream.get_json(who.token, "/api/v1/secrets", request.query_params)
        if status == 200 and isinstance(body, list):
            body = [{k: v for k, v in s.items() if k in SECRET_FIELDS} for s in body if isinstance(s, dict)]
        return gateway_json(status, body, headers)
    resp = await upstream.open_stream("GET", who.token, f"/api/v1/{path}", params=request.query_params)
    kept = {k: v for k, v in resp.headers.items() if k.lower() in KEPT_HEADERS}
    return StreamingResponse(resp.aiter_raw(), status_code=resp.status_code, headers=kept,
                             background=BackgroundTask(resp.aclose))


ID = re.compile(f"^{SEGMENT}$")


async def act(request: Request, path: str, *ids: str) -> JSONResponse:
    who = await signed_in(request)
    check_change(request, who)
    if not all(ID.match(i) for i in ids):  # never a slash, "..", "?" or "%" into the gateway's path
        return JSONResponse({"detail": "no such object"}, status_code=404)
    upstream: Upstream = request.app.state.upstream
    r = await upstream.request("POST", who.token, path)
    try:
        body = r.json()
    except ValueError:
        body = {"detail": r.text[:500]}
    return JSONResponse(body, status_code=r.status_code)


@router.post("/api/deployments/{name}/stop")
async def stop_deployment(name: str, request: Request) -> JSONResponse:
    return await act(request, f"/api/v1/deployments/{name}/stop", name)


@router.post("/api/containers/{container_id}/stop")
async def stop_container(container_id: str, request: Request) -> JSONResponse:
    return await act(request, f"/api/v1/containers/{container_id}/stop", container_id)


@router.post("/api/workers/{worker_id}/{action}")
async def worker_action(worker_id: str, action: str, request: Request) -> JSONResponse:
    if action not in ("cordon", "drain", "uncordon"):
        await signed_in(request)
        return JSONResponse({"detail": f"unknown action {action!r}: cordon, drain or uncordon"}, status_code=404)
    return await act(request, f"/api/v1/workers/{worker_id}/{action}", worker_id)


@router.post("/api/tasks/{task_id}/cancel")
async def cancel_task(task_id: str, request: Request) -> JSONResponse:
    return await act(request, f"/api/v1/tasks/{task_id}/cancel", task_id)


@router.post("/api/calls/{call_id}/cancel")
async def cancel_call(call_id: str, request: Request) -> JSONResponse:
    return await act(request, f"/api/v1/calls/{call_id}/cancel", call_id)
