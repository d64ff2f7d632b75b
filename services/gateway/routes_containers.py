"""Containers: list, show, request a bare one, stop, logs (streamed from the worker that runs it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx
import msgspec
from fastapi import APIRouter, HTTPException, Query, Request, Response
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from levers9.contracts import InvalidName, check_id, uuid7
from levers9.contracts import events as E
from levers9.contracts.images import BUILD_POOL
from levers9.contracts.spec import Resources
from levers9.runtime.views import ENDED

from .auth import User
from .deps import Gateway
from .state import Gateway as GatewayState
from .state import row_json

router = APIRouter()

REQUEST_FIELDS = ("pool", "deployment_id")  # besides the Resources fields


class InvalidRequest(ValueError):
    """A container request body that does not validate; the message says which field and why."""


class RefusedPool(InvalidRequest):
    """A pool a tenant's container may not run on (403, where a body that does not validate is 422)."""


BUILD_POOL_REFUSED = (f"pool {BUILD_POOL!r} is refused: it holds the platform's image builders, which run no "
                      "tenant's container; ask for another pool (or none: the default pool)")


@dataclass(frozen=True)
class BareRequest:
    resources: Resources
    where: dict[str, str] = field(default_factory=dict)  # pool / deployment_id, when given


def parse_container_request(body: bytes) -> BareRequest:
    """POST /api/v1/containers' body: Resources' fields (millicores, MiB) plus pool and deployment_id."""
    try:
        data = msgspec.json.decode(body) if body.strip() else {}
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"the body is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidRequest("the body must be a JSON object")
    known = (*Resources.__struct_fields__, *REQUEST_FIELDS)
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise InvalidRequest(f"unknown field {unknown[0]!r}: a container request takes {', '.join(known)} "
                             "(cpu in millicores, memory in MiB)")
    where = {k: data.pop(k) for k in REQUEST_FIELDS if k in data}
    try:
        for k, v in where.items():
            if k == "pool" or v != "":
                check_id(v, k)
        if where.get("pool") == BUILD_POOL:
            raise RefusedPool(BUILD_POOL_REFUSED)
        return BareRequest(msgspec.convert(data, Resources), where)
    except InvalidName as exc:
        raise InvalidRequest(str(exc)) from None
    except msgspec.ValidationError as exc:
        raise InvalidRequest(f"the container request is not valid: {exc}") from None


def container_json(record: Any) -> dict[str, Any]:
    return row_json(record, "request")


async def container_row(gw: GatewayState, workspace: str, container_id: str) -> Any:
    row = await gw.pool.fetchrow("SELECT * FROM gateway.containers WHERE workspace=$1 AND container_id=$2",
                                 workspace, container_id)
    if row is None:
        raise HTTPException(404, f"no container {container_id!r} in workspace {workspace!r}")
    return row


@router.get("/api/v1/containers")
async def list_containers(caller: User, gw: Gateway, response: Response, all: bool = False,
                          limit: int = Query(1000, ge=1, le=10000, description="at most this many, newest first"),
                          offset: int = Query(0, ge=0, le=1_000_000_000, description="skip this many (the next page)")
                          ) -> list[dict[str, Any]]:
    """The workspace's containers, most recently changed first; `X-Total-Count` says how many match
    in all, so a client pages with `offset` until it has them."""
    live = "AND ($2 OR c.status NOT IN ('stopped', 'failed'))"
    total = await gw.pool.fetchval(f"SELECT count(*) FROM gateway.containers c WHERE c.workspace = $1 {live}",
                                   caller.workspace, all)
    rows = await gw.pool.fetch(
        "SELECT c.*, d.name AS deployment_name FROM gateway.containers c LEFT JOIN gateway.deployments d "
        f"ON d.workspace = c.workspace AND d.deployment_id = c.deployment_id WHERE c.workspace = $1 {live} "
        "ORDER BY c.updated_at DESC, c.container_id LIMIT $3 OFFSET $4", caller.workspace, all, limit, offset)
    response.headers["X-Total-Count"] = str(total)
    return [container_json(r) for r in rows]


@router.get("/api/v1/containers/{container_id}")
async def get_container(container_id: str, caller: User, gw: Gateway) -> dict[str, Any]:
    """The container's row, with `first_answer_at`: when it first answered a proxied endpoint call (the
    endpoint meter's, endpoint_store.py; flushed every few seconds), null until then or for a function's."""
    out = container_json(await container_row(gw, caller.workspace, container_id))
    at = await gw.pool.fetchval("SELECT at FROM gateway.container_first_answers WHERE workspace=$1 AND container_id=$2",
                                caller.workspace, container_id)
    out["first_answer_at"] = msgspec.to_builtins(at)
    return out


@router.post("/api/v1/containers", status_code=202)
async def request_container(request: Request, caller: User, gw: Gateway) -> dict[str, Any]:
    try:
        asked = parse_container_request(await request.body())
    except InvalidRequest as exc:
        raise HTTPException(403 if isinstance(exc, RefusedPool) else 422, str(exc)) from None
    event = E.ContainerRequested(container_id=uuid7(), resources=asked.resources, reason="api",
                                 pool=asked.where.get("pool", "default"),
                                 deployment_id=asked.where.get("deployment_id", ""))
    env, appended = await gw.publish(event, caller.workspace)
    return {"container_id": event.container_id, "correlation_id": env.correlation_id,
            "event_id": env.id, "seq": appended.seq}


@router.post("/api/v1/containers/{container_id}/stop", status_code=202)
async def stop_container(container_id: str, caller: User, gw: Gateway) -> dict[str, Any]:
    row = await container_row(gw, caller.workspace, container_id)
    if row["status"] in ENDED:  # nothing to stop: a stop now would only be noise in its history
        return {"container_id": container_id, "correlation_id": row["correlation_id"], "status": row["status"]}
    env, _ = await gw.publish(E.ContainerStopRequested(container_id=container_id, reason="stopped by user"),
                              caller.workspace, row["correlation_id"])
    return {"container_id": container_id, "correlation_id": env.correlation_id}


@router.get("/api/v1/containers/{container_id}/logs")
async def container_logs(container_id: str, caller: User, gw: Gateway, follow: bool = False) -> StreamingResponse:
    row = await container_row(gw, caller.workspace, container_id)
    worker = await gw.pool.fetchrow("SELECT address FROM gateway.workers WHERE worker_id=$1", row["worker_id"])
    if worker is None or not worker["address"]:
        raise HTTPException(404, f"container {container_id} has no logs yet (not placed on a worker)")
    upstream = gw.http.build_request("GET", f"{worker['address']}/containers/{container_id}/logs",
                                     params={"follow": str(follow).lower()})
    try:
        resp = await gw.http.send(upstream, stream=True)
    except httpx.HTTPError as exc:
        raise HTTPException(502, f"worker {row['worker_id']} does not answer: {exc}") from None
    if resp.status_code != 200:
        await resp.aclose()
        raise HTTPException(resp.status_code, f"worker {row['worker_id']} has no log for {container_id}")
    return StreamingResponse(resp.aiter_raw(), media_type="text/plain", background=BackgroundTask(resp.aclose))
