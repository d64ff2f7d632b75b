"""Checkpoints: list, delete, and ask for one of a ready container."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException

from levers9.contracts import events as E

from .auth import User
from .deps import Gateway
from .routes_containers import container_row
from .state import row_json

router = APIRouter()


@router.get("/api/v1/checkpoints")
async def list_checkpoints(caller: User, gw: Gateway, all: bool = False) -> list[dict[str, Any]]:
    rows = await gw.pool.fetch(
        "SELECT * FROM gateway.checkpoints WHERE workspace=$1 AND ($2 OR status <> 'deleted') "
        "ORDER BY created_at DESC", caller.workspace, all)
    return [row_json(r) for r in rows]


@router.delete("/api/v1/checkpoints/{checkpoint_id}")
async def delete_checkpoint(checkpoint_id: str, caller: User, gw: Gateway) -> dict[str, Any]:
    status = await gw.pool.fetchval("SELECT status FROM gateway.checkpoints WHERE workspace=$1 AND "
                                    "checkpoint_id=$2", caller.workspace, checkpoint_id)
    if status is None or status == "deleted":
        raise HTTPException(404, f"no checkpoint {checkpoint_id!r} in workspace {caller.workspace!r}")
    await gw.publish(E.CheckpointDeleted(checkpoint_id=checkpoint_id), caller.workspace)
    return {"checkpoint_id": checkpoint_id, "deleted": True}


@router.post("/api/v1/containers/{container_id}/checkpoint", status_code=202)
async def checkpoint_container(container_id: str, caller: User, gw: Gateway) -> dict[str, Any]:
    row = await container_row(gw, caller.workspace, container_id)
    if row["status"] != "ready":
        raise HTTPException(409, f"container {container_id} is {row['status']}: only a ready container "
                                 "can be checkpointed")
    env, _ = await gw.publish(E.ContainerCheckpointRequested(container_id=container_id), caller.workspace,
                              row["correlation_id"])
    return {"container_id": container_id, "correlation_id": env.correlation_id}
