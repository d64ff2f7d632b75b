"""Routes for workers, with their own token: the code archive, the secrets and the checkpoints' data
keys of a container placed on them.

The worker passes `seq`, the stream sequence of the ContainerScheduled it acts on; the gateway waits
(in memory, bounded) until its containers projection has applied it, then checks that the container
is placed on that very worker. Without `seq` (or 0: an older worker) it waits for the last event of that
container instead.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import Response

from levers9.contracts import InvalidName
from levers9.contracts.spec import spec_from_builtins
from levers9.contracts.subjects import filter_subject
from levers9.runtime.sealing import HEADER_MAX, SealError, archive_data_key, is_sealed_archive
from levers9.runtime.secrets import SecretKeyMissing, SecretUnreadable, checkpoint_context, decrypt, keyring
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


@router.get("/api/v1/internal/deployments/{deployment_id}/secrets")
async def secrets(deployment_id: str, workspace: str, container_id: str, caller: AnyCaller, gw: Gateway,
                  names: list[str] = Query(default=[]), seq: int | None = None) -> dict[str, str]:
    """The named secrets of a container placed on the calling worker, opened here: a worker without
    the secrets keyring (a Kubernetes pool's, an attached cluster's) gets them this way, and only
    those its container's spec names (its env secrets and its buckets' credentials)."""
    worker_id = worker_of(caller)
    if not worker_id:
        raise HTTPException(403, "only a worker token can fetch a container's secrets")
    row = await placed_spec_row(gw, workspace, container_id, deployment_id, worker_id, seq)
    spec = spec_from_builtins(json.loads(row["spec"]))
    allowed = set(spec.secrets) | {b.secret for b in spec.buckets if b.secret}
    if set(names) - allowed:
        raise HTTPException(403, f"secret(s) {', '.join(sorted(set(names) - allowed))} are not named by the spec "
                                 f"of container {container_id}")
    rows = await gw.pool.fetch("SELECT name, ciphertext FROM gateway.secrets WHERE workspace=$1 AND name = ANY($2)",
                               workspace, list(names))
    missing = sorted(set(names) - {r["name"] for r in rows})
    if missing:
        raise HTTPException(404, f"secret(s) {', '.join(missing)} not found in workspace {workspace!r}: create with "
                                 "`levers9 secret create NAME VALUE`")
    try:
        return {r["name"]: decrypt(gw.settings, workspace, r["name"], r["ciphertext"]) for r in rows}
    except (SecretKeyMissing, SecretUnreadable) as exc:
        raise HTTPException(503, f"the gateway cannot open the secrets: {exc}") from None


@router.get("/api/v1/internal/deployments/{deployment_id}/checkpoint-key")
async def checkpoint_key(deployment_id: str, workspace: str, container_id: str, checkpoint_id: str,
                         caller: AnyCaller, gw: Gateway, seq: int | None = None) -> dict[str, str]:
    """The data key of one sealed checkpoint of the deployment of a container placed on the calling
    worker: a worker without the keyring (a Kubernetes pool's, an attached cluster's) restores it with
    that key, which opens that archive and nothing else; the keyring never leaves the gateway."""
    worker_id = worker_of(caller)
    if not worker_id:
        raise HTTPException(403, "only a worker token can fetch a checkpoint's key")
    await placed_spec_row(gw, workspace, container_id, deployment_id, worker_id, seq)
    row = await gw.pool.fetchrow("SELECT deployment_id, bucket, key FROM gateway.checkpoints WHERE workspace=$1 "
                                 "AND checkpoint_id=$2 AND status <> 'deleted'", workspace, checkpoint_id)
    if row is None or row["deployment_id"] != deployment_id or not row["key"]:
        raise HTTPException(404, f"no stored checkpoint {checkpoint_id} of deployment {deployment_id}")
    async with s3_client(gw.settings) as client:
        obj = await client.get_object(Bucket=row["bucket"], Key=row["key"], Range=f"bytes=0-{HEADER_MAX - 1}")
        async with obj["Body"] as body:
            head = await body.read()
    if not is_sealed_archive(head):  # stored before sealing existed: it opens without a key
        return {"data_key": ""}
    try:
        key = archive_data_key(keyring(gw.settings), head, checkpoint_context(row["bucket"], row["key"]))
    except SecretKeyMissing as exc:
        raise HTTPException(503, f"the gateway cannot open checkpoints: {exc}") from None
    except SealError as exc:
        raise HTTPException(409, f"checkpoint {checkpoint_id} cannot be opened: {exc}") from None
    return {"data_key": base64.b64encode(key).decode()}
