"""Deployments: deploy (a spec and a code archive), list, stop, delete.

A deploy decodes the SDK's JSON into the one typed DeploymentSpec, names the built image its
blueprint asks for (spec.image_ref, from the gateway's view of builds; 409 while it is not built), stores the archive in the
workspace's bucket under its sha256, and appends DeploymentCreated for the next free version
(optimistic concurrency: two concurrent deploys of a name never get the same version). It answers
once the gateway's own projection has it, so a call right after the deploy finds it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
from typing import Any, get_args

import msgspec
from fastapi import APIRouter, File, Form, HTTPException, Request, UploadFile

from levers9.contracts import envelope
from levers9.contracts import events as E
from levers9.contracts.images import BUILD_POOL
from levers9.contracts.spec import DeploymentSpec, InvalidSpec, Name, decode_spec
from levers9.runtime.bus import ConcurrencyConflict
from levers9.runtime.storage import ensure_bucket, s3_client, workspace_bucket

from .auth import User
from .body_rules import text_problem
from .code_archive import archive_problem
from .deps import Gateway
from .routes_images import resolve_image
from .routes_scaling import container_counts
from .state import Gateway as GatewayState
from .state import row_json

log = logging.getLogger("levers9.gateway")
router = APIRouter()

MAX_CODE_BYTES = 16 * 1024 * 1024
NAME_RE = re.compile(get_args(Name)[1].pattern)  # the spec's own rule for a name
VERSION_TRIES = 20


INSPECTIONS = asyncio.Semaphore(2)  # code archives looked into at once (each in a thread)


class NotJSON(InvalidSpec):
    """The spec is not JSON at all: 400, where a JSON spec that does not validate is 422."""


class _Named(msgspec.Struct):
    name: str | None = None


def parse_spec(text: str | bytes) -> DeploymentSpec:
    """The deploy form's `spec` field as a DeploymentSpec; InvalidSpec with a sentence otherwise.
    A bad name gets its own sentence (how to fix it), before any other check; a spec that is not
    JSON (or nests too deep, or is not UTF-8) is NotJSON, before any decoder sees it."""
    problem = text_problem(text if isinstance(text, str) else text.decode("utf-8", "surrogateescape"),
                           "the deployment spec")
    if problem:
        raise NotJSON(problem)
    try:
        name = msgspec.json.decode(text, type=_Named).name
    except msgspec.MsgspecError:
        name = None  # decode_spec says what is wrong
    if name is not None and not NAME_RE.fullmatch(name):
        raise InvalidSpec(f"endpoint name {name!r} is not valid: use lowercase letters, digits and '-' "
                          "(rename the function or pass name=...)")
    spec = decode_spec(text)
    if spec.pool == BUILD_POOL:
        raise InvalidSpec(f"pool {BUILD_POOL!r} is the platform's image builders: deploy to another pool")
    return spec


def with_code(spec: DeploymentSpec, sha256: str, key: str) -> DeploymentSpec:
    return msgspec.structs.replace(spec, code=msgspec.structs.replace(spec.code, sha256=sha256, key=key))


@router.post("/api/v1/deployments", status_code=201)
async def deploy(request: Request, caller: User, gw: Gateway, spec: str = Form(...),
                 code: UploadFile = File(...)) -> dict[str, Any]:
    try:
        parsed = parse_spec(spec)
    except InvalidSpec as exc:
        raise HTTPException(400 if isinstance(exc, NotJSON) else 422, str(exc)) from None
    data = await code.read(MAX_CODE_BYTES + 1)
    if len(data) > MAX_CODE_BYTES:
        raise HTTPException(413, f"the code archive is over {MAX_CODE_BYTES >> 20} MiB: deploy less "
                                 "(large data belongs in an image or a volume)")
    async with INSPECTIONS:  # off the event loop: a decompression bomb must not stall every other request
        status, problem = await asyncio.to_thread(archive_problem, data, parsed.code.module)
    if status:
        raise HTTPException(status, problem)
    # the built image is the gateway's to name (never the client's): 409 while it is not built
    image_ref = await resolve_image(gw, caller.workspace, parsed.image) if parsed.image is not None else None
    parsed = msgspec.structs.replace(parsed, image_ref=image_ref)
    sha, key = await put_code(gw, caller.workspace, data)
    return await create_deployment(gw, caller.workspace, with_code(parsed, sha, key), str(request.base_url))


@router.get("/api/v1/deployments")
async def list_deployments(caller: User, gw: Gateway, sandboxes: bool = False) -> list[dict[str, Any]]:
    """The workspace's deployments; the ones the platform made for sandboxes (`sb-…`, one per set of
    options: GET /api/v1/sandboxes lists the sandboxes) only with `sandboxes=true`."""
    rows = await gw.pool.fetch("SELECT deployment_id, name, version, status, created_at, spec "
                               "FROM gateway.deployments WHERE workspace=$1 AND status <> 'deleted' "
                               "ORDER BY name, version", caller.workspace)
    out = [d for d in (row_json(r, "spec") for r in rows) if sandboxes or not (d.get("spec") or {}).get("sandbox")]
    await container_counts(gw, caller.workspace, out)  # live and desired containers (routes_scaling)
    return out


@router.post("/api/v1/deployments/{name}/stop")
async def stop_deployment(name: str, caller: User, gw: Gateway) -> dict[str, Any]:
    return await end_deployment(gw, caller.workspace, name, delete=False)


@router.delete("/api/v1/deployments/{name}")
async def delete_deployment(name: str, caller: User, gw: Gateway) -> dict[str, Any]:
    return await end_deployment(gw, caller.workspace, name, delete=True)


async def put_code(gw: GatewayState, workspace: str, data: bytes) -> tuple[str, str]:
    sha = hashlib.sha256(data).hexdigest()
    bucket, key = workspace_bucket(workspace), f"code/{sha}.tar.gz"
    async with s3_client(gw.settings) as client:
        await ensure_bucket(client, bucket)
        await client.put_object(Bucket=bucket, Key=key, Body=data)
    return sha, key


async def create_deployment(gw: GatewayState, workspace: str, spec: DeploymentSpec, base: str) -> dict[str, Any]:
    latest = await gw.pool.fetchval("SELECT max(version) FROM gateway.deployments WHERE workspace=$1 AND name=$2",
                                    workspace, spec.name) or 0
    for version in range(latest + 1, latest + VERSION_TRIES):
        event = E.DeploymentCreated(deployment_id=f"{spec.name}-v{version}", name=spec.name, version=version,
                                    spec=spec)
        try:
            appended = await gw.bus.append(envelope(event, workspace=workspace), 0)
        except ConcurrencyConflict:
            continue  # that version was taken by a concurrent deploy
        if not await gw.wait_projected(appended.seq, "deployments"):
            log.warning("deployment %s (seq %d) is not projected yet; answering anyway", event.deployment_id,
                        appended.seq)
        path = {"function": f"function/{spec.app_name}/{spec.name}", "box": f"box/{spec.name}/"}.get(
            spec.code.kind, f"endpoint/{spec.name}")
        return {"deployment_id": event.deployment_id, "name": spec.name, "version": version,
                "url": f"{base.rstrip('/')}/{path}"}
    raise HTTPException(409, f"could not allocate a version for {spec.name!r}; try again")


async def end_deployment(gw: GatewayState, workspace: str, name: str, delete: bool) -> dict[str, Any]:
    rows = await gw.pool.fetch("SELECT deployment_id FROM gateway.deployments WHERE workspace=$1 AND name=$2 "
                               "AND status <> 'deleted'", workspace, name)
    if not rows:
        raise HTTPException(404, f"no deployment {name!r} in workspace {workspace!r}: see `levers9 deployments list`")
    ids = [r["deployment_id"] for r in rows]
    for dep_id in ids:
        await gw.publish(E.DeploymentDeleted(deployment_id=dep_id) if delete
                         else E.DeploymentStopped(deployment_id=dep_id, reason="stopped by user"), workspace)
    live = await gw.pool.fetch("SELECT container_id, correlation_id FROM gateway.containers WHERE workspace=$1 "
                               "AND deployment_id = ANY($2) AND status NOT IN ('stopped','failed')", workspace, ids)
    for c in live:
        await gw.publish(E.ContainerStopRequested(container_id=c["container_id"], reason="deployment stopped"),
                         workspace, c["correlation_id"])
    return {"name": name, "deployments": ids, "containers_stopped": len(live), "deleted": delete}
