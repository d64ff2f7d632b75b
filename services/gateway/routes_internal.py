"""Routes for workers, with their own token: the code archive of a container placed on them.

The worker passes `seq`, the stream sequence of the ContainerScheduled it acts on; the gateway waits
(in memory, bounded) until its containers projection has applied it, then checks that the container
is placed on that very worker. Without `seq` (or 0: an older worker) it waits for the last event of that
container instead.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, HTTPException
from fastapi.responses import Response

from levers9.contracts import InvalidName
from levers9.contracts.spec import spec_from_builtins
from levers9.contracts.subjects import filter_subject
from levers9.runtime.storage import s3_client, workspace_bucket

from .auth import AnyCaller, worker_of
from .deps import Gateway
from .state import Gateway as GatewayState

router = APIRouter()

PLACEMENT_WAIT_S = 5.0


async def placed_spec_row(gw: GatewayState, workspace: str, container_id: str, deployment_id: str,
                          worker_id: str, seq: int | None) -> Any:
    """The container's deployment row once the projection shows it placed on `worker_id`; 404 otherwise."""
    not_placed = HTTPException(404, f"container {container_id} is not placed on worker {worker_id}")
    if not seq:  # no stream sequence is 0: an older worker that did not say
        try:
            seq = await gw.bus.last_seq(filter_subject(workspace=workspace, aggregate="container",
                                                       aggregate_id=container_id))
        except InvalidName:
            raise not_placed from None
    await gw.wait_projected(seq, "containers", timeout=PLACEMENT_WAIT_S)
    row = await gw.pool.fetchrow(
        "SELECT c.worker_id, d.spec FROM gateway.containers c JOIN gateway.deployments d "
        "ON d.workspace = c.workspace AND d.deployment_id = c.deployment_id "
        "WHERE c.workspace=$1 AND c.container_id=$2 AND c.deployment_id=$3", workspace, container_id, deployment_id)
    if row is None or row["worker_id"] != worker_id:
        raise not_placed
    return row


@router.get("/api/v1/internal/deployments/{deployment_id}/code")
async def code(deployment_id: str, workspace: str, container_id: str, caller: AnyCaller, gw: Gateway,
               seq: int | None = None) -> Response:
    worker_id = worker_of(caller)
    if not worker_id:
        raise HTTPException(403, "only a worker token can fetch code archives")
    row = await placed_spec_row(gw, workspace, container_id, deployment_id, worker_id, seq)
    spec = spec_from_builtins(json.loads(row["spec"]))
    async with s3_client(gw.settings) as client:
        obj = await client.get_object(Bucket=workspace_bucket(workspace), Key=spec.code.key)
        data = await obj["Body"].read()
    return Response(data, media_type="application/gzip")
