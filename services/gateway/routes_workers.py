"""Workers: list them; cordon, drain or uncordon one (platform objects: an admin token)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException

from levers9.contracts import SYSTEM_WORKSPACE
from levers9.contracts import events as E

from .auth import Admin, User
from .deps import Gateway
from .state import row_json

router = APIRouter()

ACTIONS = ("cordon", "drain", "uncordon")


def worker_action_event(worker_id: str, action: str) -> E.Event | None:
    """The event an action on a worker appends; None for an unknown action."""
    if action == "cordon":
        return E.WorkerCordoned(worker_id=worker_id)
    if action == "drain":
        return E.WorkerCordoned(worker_id=worker_id, drain=True)
    if action == "uncordon":
        return E.WorkerUncordoned(worker_id=worker_id)
    return None


@router.get("/api/v1/workers")
async def list_workers(caller: User, gw: Gateway) -> list[dict[str, Any]]:
    """The platform's workers, and those of attached clusters the caller's workspace owns or was
    shared (another workspace's cluster is its own business), each with its `cluster` ("" : the
    platform's)."""
    rows = await gw.pool.fetch(
        "SELECT w.*, COALESCE(cw.cluster, '') AS cluster FROM gateway.workers w "
        "LEFT JOIN gateway.cluster_workers cw ON cw.worker_id = w.worker_id "
        "WHERE cw.cluster IS NULL OR EXISTS (SELECT 1 FROM gateway.clusters c WHERE c.name = cw.cluster "
        "AND c.workspace = $1) OR EXISTS (SELECT 1 FROM gateway.cluster_shares s WHERE s.name = cw.cluster "
        "AND s.workspace = $1) ORDER BY w.worker_id", caller.workspace)
    return [row_json(r) for r in rows]


@router.post("/api/v1/workers/{worker_id}/{action}", status_code=202)
async def worker_action(worker_id: str, action: str, caller: Admin, gw: Gateway) -> dict[str, Any]:
    if await gw.pool.fetchval("SELECT 1 FROM gateway.workers WHERE worker_id=$1", worker_id) is None:
        raise HTTPException(404, f"no worker {worker_id!r}: see `levers9 workers list`")
    event = worker_action_event(worker_id, action)
    if event is None:
        raise HTTPException(404, f"unknown action {action!r}: use {', '.join(ACTIONS[:-1])} or {ACTIONS[-1]}")
    await gw.publish(event, SYSTEM_WORKSPACE)
    return {"worker_id": worker_id, "action": action}
