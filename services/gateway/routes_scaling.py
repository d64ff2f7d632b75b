"""Scaling at run time: `POST /api/v1/deployments/{name}/scale` appends DeploymentScaled to the newest
active version; the scheduler's autoscaler applies it on its next pass (within a second). And what
`deployments list` shows of each deployment: its live containers and how many the policy wants.

The change is checked as a deployed spec is (levers9.contracts.autoscaling.rescale: min <= max, a
target within the hard cap, a buffer within max), answered 422 with the field named, and appended
expecting the deployment's last sequence, so two concurrent changes never merge into a combination
neither checked (the second answers 409: try again).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import msgspec
from fastapi import APIRouter, HTTPException
from pydantic import BaseModel, Field

from levers9.contracts import envelope
from levers9.contracts import events as E
from levers9.contracts.autoscaling import Load, desired_of, governed, rescale, superseded
from levers9.contracts.spec import spec_from_builtins
from levers9.runtime.bus import ConcurrencyConflict

from .auth import User
from .deps import Gateway
from .state import Gateway as GatewayState
from .state import route_key

router = APIRouter()


class ScaleRequest(BaseModel):
    min: int | None = Field(None, ge=0, le=100, description="min_containers")
    max: int | None = Field(None, ge=1, le=1000, description="max_containers")
    buffer: int | None = Field(None, ge=0, le=100, description="buffer_containers")
    target_concurrency: int | None = Field(None, ge=0, le=10_000)


@router.post("/api/v1/deployments/{name}/scale")
async def scale_deployment(name: str, body: ScaleRequest, caller: User, gw: Gateway) -> dict[str, Any]:
    row = await gw.pool.fetchrow("SELECT deployment_id, spec, last_seq FROM gateway.deployments WHERE workspace=$1 "
                                 "AND name=$2 AND status='active' ORDER BY version DESC LIMIT 1", caller.workspace, name)
    if row is None:
        raise HTTPException(404, f"no active deployment {name!r} in workspace {caller.workspace!r}: see "
                                 "`levers9 deployments list`")
    spec = spec_from_builtins(_json(row["spec"]))
    try:
        scaling = rescale(spec.scaling, min_containers=body.min, max_containers=body.max,
                          buffer_containers=body.buffer, target_concurrency=body.target_concurrency)
    except ValueError as exc:
        raise HTTPException(422, f"cannot scale {name!r}: {exc}") from None
    event = E.DeploymentScaled(deployment_id=row["deployment_id"], min_containers=body.min, max_containers=body.max,
                               buffer_containers=body.buffer, target_concurrency=body.target_concurrency)
    try:
        appended = await gw.bus.append(envelope(event, workspace=caller.workspace), row["last_seq"])
    except ConcurrencyConflict:
        raise HTTPException(409, f"{name!r} changed meanwhile: try again") from None
    await gw.wait_projected(appended.seq, "deployments")
    return {"name": name, "deployment_id": row["deployment_id"], "scaling": msgspec.to_builtins(scaling)}


def _json(value: Any) -> dict[str, Any]:
    return msgspec.json.decode(value) if isinstance(value, (str, bytes)) else dict(value)


async def container_counts(gw: GatewayState, workspace: str, deployments: list[dict[str, Any]]) -> None:
    """Add `containers` (live ones) and `desired` (the policy's count from this gateway's view of the
    load: with several gateways the autoscaler's sum may be higher; null where the autoscaler does
    not scale the deployment) to each listed deployment."""
    rows = await gw.pool.fetch("SELECT deployment_id, count(*) AS n FROM gateway.containers WHERE workspace=$1 "
                               "AND status NOT IN ('stopped','failed','stopping') "
                               "AND COALESCE(request->>'session_id', '') = '' "  # a session's sandbox is its caller's
                               "GROUP BY deployment_id", workspace)
    live = {r["deployment_id"]: r["n"] for r in rows}
    newest: dict[str, int] = {}
    for d in deployments:
        if d.get("status") == "active":
            newest[d["name"]] = max(newest.get(d["name"], 0), d["version"])
    now = dt.datetime.now(dt.timezone.utc)
    for d in deployments:
        d["containers"] = live.get(d["deployment_id"], 0)
        d["desired"] = 0
        if d.get("status") != "active" or not isinstance(d.get("spec"), dict):
            continue
        try:
            spec = spec_from_builtins(d["spec"])
            scaling = spec.scaling
            if not governed(spec):  # ad-hoc function sandboxes: the worker's keep-warm, no policy
                d["desired"] = None
                continue
            if d["version"] < newest.get(d["name"], 0):  # as the autoscaler: an older version keeps none warm
                scaling = superseded(scaling)
        except (msgspec.ValidationError, ValueError, TypeError):
            continue
        r = gw.routers.get(route_key(workspace, d["deployment_id"]))
        load = Load(waiting=r.waiting, inflight=sum(s.inflight for s in r.containers.values())) if r else Load()
        d["desired"] = desired_of(scaling, load, now)[0]
