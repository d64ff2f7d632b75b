"""Sandboxes in the gateway: create one (its deployment, its container, wait until its agent is
ready), find a workspace's sandbox, list them, snapshot and terminate them, and end those whose
lifetime ran out. The decisions are levers9.contracts.sandboxes' (pure); this is the shell.

A sandbox's container is requested for it alone (session_id `sandbox-<id>`): a router of its own
(`session:sandbox-<id>`, as a function session's) hears its container events, so creating one waits
on that router like a call waits for a container, with no polling.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import msgspec

from levers9.contracts import events as E
from levers9.contracts import uuid7
from levers9.contracts.sandboxes import (
    LIVE,
    SESSION_PREFIX,
    SandboxRequest,
    expired,
    sandbox_spec,
    session_of,
    status_of,
)
from levers9.contracts.spec import DeploymentSpec

from .function_targets import TargetError, built_image, create_first_version
from .router import DeploymentRouter, NoCapacity, StartFailed
from .routes_invoke import checkpoint_ref
from .state import Deployment
from .state import Gateway as GatewayState

log = logging.getLogger("levers9.gateway.sandboxes")

START_TIMEOUT_S = 300.0
SNAPSHOT_TIMEOUT_S = 300.0
SWEEP_EVERY_S = 5.0
POLL_S = 0.1


class SandboxError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Found:
    sandbox_id: str
    status: str  # its container's
    address: str
    workdir: str
    correlation_id: str
    deployment_id: str


def not_found(sandbox_id: str, workspace: str) -> SandboxError:
    return SandboxError(404, f"no sandbox {sandbox_id[:80]!r} in workspace {workspace!r}: "
                             "`levers9 sandboxes list` shows yours")


async def find(gw: GatewayState, workspace: str, sandbox_id: str, ready: bool = True) -> Found:
    """This workspace's sandbox (another workspace's is none: 404); with `ready`, 409 unless it runs."""
    row = await gw.pool.fetchrow(
        "SELECT status, address, correlation_id, deployment_id, request->'spec'->'sandbox'->>'workdir' AS workdir "
        "FROM gateway.containers WHERE workspace=$1 AND container_id=$2 AND request->>'session_id'=$3",
        workspace, sandbox_id, session_of(sandbox_id))
    if row is None:
        raise not_found(sandbox_id, workspace)
    found = Found(sandbox_id, row["status"], row["address"], row["workdir"] or "/sandbox", row["correlation_id"],
                  row["deployment_id"])
    if ready and row["status"] != "ready":
        raise SandboxError(409 if row["status"] in LIVE else 410,
                           f"sandbox {sandbox_id} is {status_of(row['status'])}, not running")
    return found


async def deployment_of(gw: GatewayState, workspace: str, spec: DeploymentSpec) -> Deployment:
    """The sandbox deployment of these options, created on first use (its image built first)."""
    row = await gw.pool.fetchrow("SELECT * FROM gateway.deployments WHERE workspace=$1 AND name=$2 AND "
                                 "status='active' ORDER BY version DESC LIMIT 1", workspace, spec.name)
    if row is not None:
        return Deployment.from_row(row)
    if spec.image is not None:
        async def quiet(_: str) -> None:
            return None
        try:
            spec = msgspec.structs.replace(spec, image_ref=await built_image(gw, workspace, spec, quiet))
        except TargetError as exc:
            raise SandboxError(422 if exc.code == "FAILED_PRECONDITION" else 504, str(exc)) from None
    row = await create_first_version(gw, workspace, spec)
    if row is None:
        raise SandboxError(503, f"the sandbox deployment {spec.name} is not projected yet: try again")
    return Deployment.from_row(row)


async def snapshot_source(gw: GatewayState, workspace: str, checkpoint_id: str) -> tuple[Deployment, Any]:
    """The deployment and the checkpoint a `from_snapshot` restores; 404 with a sentence otherwise."""
    row = await gw.pool.fetchrow("SELECT * FROM gateway.checkpoints WHERE workspace=$1 AND checkpoint_id=$2",
                                 workspace, checkpoint_id)
    if row is None or row["status"] == "deleted":
        raise SandboxError(404, f"no snapshot {checkpoint_id[:80]!r} in workspace {workspace!r}")
    if row["status"] != "available":
        raise SandboxError(409, f"snapshot {checkpoint_id} is {row['status']}, not available to restore")
    dep_row = await gw.pool.fetchrow("SELECT * FROM gateway.deployments WHERE workspace=$1 AND deployment_id=$2",
                                     workspace, row["deployment_id"])
    if dep_row is None or Deployment.from_row(dep_row).spec.sandbox is None:
        raise SandboxError(400, f"checkpoint {checkpoint_id} is not a sandbox's snapshot")
    return Deployment.from_row(dep_row), checkpoint_ref(dict(row))


async def create(gw: GatewayState, workspace: str, req: SandboxRequest, token_id: str) -> dict[str, Any]:
    """A sandbox, running: its deployment, SandboxCreated, its container requested and waited for."""
    began = time.monotonic()
    ref = None
    if req.from_snapshot:
        dep, ref = await snapshot_source(gw, workspace, req.from_snapshot)
    else:
        dep = await deployment_of(gw, workspace, sandbox_spec(req))
    sandbox_id = uuid7()
    correlation = uuid7()
    await gw.publish(E.SandboxCreated(sandbox_id=sandbox_id, deployment_id=dep.deployment_id, app=dep.spec.app_name,
                                      from_snapshot=req.from_snapshot, token_id=token_id), workspace, correlation)
    router = gw.routers[f"session:{session_of(sandbox_id)}"] = DeploymentRouter(
        f"session:{session_of(sandbox_id)}", concurrency=1_000_000, max_containers=1)

    async def request_container() -> str:
        event = E.ContainerRequested(
            container_id=sandbox_id, deployment_id=dep.deployment_id, deployment_version=dep.version,
            resources=dep.spec.resources, pool=dep.spec.pool, spec=dep.spec, checkpoint=ref,
            reason="sandbox restored from a snapshot" if ref else "sandbox created", session_id=session_of(sandbox_id))
        gw.container_deployment[sandbox_id] = f"session:{session_of(sandbox_id)}"
        await gw.publish(event, workspace, correlation)
        return sandbox_id

    try:
        slot = await router.acquire(START_TIMEOUT_S, request_container)
        await router.release(slot)
    except (StartFailed, NoCapacity) as exc:
        await terminate(gw, workspace, sandbox_id, f"it did not start: {exc}")
        raise SandboxError(502 if isinstance(exc, StartFailed) else 503,
                           f"sandbox {sandbox_id} did not start: {exc}") from None
    finally:
        gw.routers.pop(f"session:{session_of(sandbox_id)}", None)
    if ref is not None and not slot.restored:
        note = await gw.pool.fetchval("SELECT note FROM gateway.containers WHERE workspace=$1 AND container_id=$2",
                                      workspace, sandbox_id)
        await terminate(gw, workspace, sandbox_id, "its snapshot was not restored")
        raise SandboxError(502, f"snapshot {req.from_snapshot} could not be restored ({note or 'no reason given'}); "
                                "the sandbox was terminated rather than started empty")
    return {"sandbox_id": sandbox_id, "status": "running", "deployment_id": dep.deployment_id,
            "from_snapshot": req.from_snapshot, "correlation_id": correlation,
            "workdir": dep.spec.sandbox.workdir if dep.spec.sandbox else "/sandbox",
            "started_ms": round(1000 * (time.monotonic() - began), 1)}


async def terminate(gw: GatewayState, workspace: str, sandbox_id: str, reason: str) -> None:
    await gw.publish(E.SandboxTerminated(sandbox_id=sandbox_id, reason=reason), workspace)
    await gw.publish(E.ContainerStopRequested(container_id=sandbox_id, reason=f"sandbox terminated: {reason}"),
                     workspace)


async def listing(gw: GatewayState, workspace: str, all: bool = False) -> list[dict[str, Any]]:
    rows = await gw.pool.fetch(
        "SELECT container_id, status, worker_id, deployment_id, requested_at, ready_at, restored_from, reason, "
        "cpu_millicores, memory_mib, request->'spec'->>'app_name' AS app, "
        "request->'spec'->'sandbox' AS sandbox, request->'spec'->'scaling'->>'keep_warm_seconds' AS idle "
        "FROM gateway.containers WHERE workspace=$1 AND request->>'session_id' LIKE $2 "
        "AND ($3 OR status NOT IN ('stopped', 'failed')) ORDER BY requested_at DESC LIMIT 1000",
        workspace, SESSION_PREFIX + "%", all)
    out = []
    for r in rows:
        options = json.loads(r["sandbox"]) if r["sandbox"] else {}
        out.append({"sandbox_id": r["container_id"], "status": status_of(r["status"]), "app": r["app"] or "",
                    "container_status": r["status"], "worker_id": r["worker_id"], "deployment_id": r["deployment_id"],
                    "created_at": r["requested_at"].isoformat() if r["requested_at"] else None,
                    "ready_at": r["ready_at"].isoformat() if r["ready_at"] else None,
                    "from_snapshot": r["restored_from"], "workdir": options.get("workdir", "/sandbox"),
                    "timeout": options.get("timeout_seconds"), "idle_timeout": int(r["idle"] or 0),
                    "cpu_millicores": r["cpu_millicores"], "memory_mib": r["memory_mib"], "reason": r["reason"]})
    return out


async def snapshot(gw: GatewayState, workspace: str, found: Found) -> dict[str, Any]:
    """Ask the sandbox's worker for a dump and wait until it is stored (or failed: 502 with why)."""
    began = time.time()
    await gw.publish(E.ContainerCheckpointRequested(container_id=found.sandbox_id), workspace, found.correlation_id)
    deadline = time.monotonic() + SNAPSHOT_TIMEOUT_S
    while time.monotonic() < deadline:
        row = await gw.pool.fetchrow(
            "SELECT checkpoint_id, status, reason, size_bytes FROM gateway.checkpoints WHERE workspace=$1 "
            "AND created_at >= to_timestamp($3) AND (container_id=$2 OR (deployment_id=$4 AND container_id='' "
            "AND status='checkpoint_failed')) ORDER BY created_at DESC LIMIT 1",
            workspace, found.sandbox_id, began - 1.0, found.deployment_id)
        if row is not None and row["status"] == "available":
            await gw.publish(E.SandboxSnapshotted(sandbox_id=found.sandbox_id, checkpoint_id=row["checkpoint_id"]),
                             workspace, found.correlation_id)
            return {"snapshot_id": row["checkpoint_id"], "size_bytes": row["size_bytes"],
                    "seconds": round(time.time() - began, 2)}
        if row is not None and row["status"] in ("checkpoint_failed", "restore_failed"):
            raise SandboxError(502, f"the snapshot of sandbox {found.sandbox_id} failed: {row['reason']}")
        await asyncio.sleep(POLL_S)
    raise SandboxError(504, f"the snapshot of sandbox {found.sandbox_id} was not stored within "
                            f"{SNAPSHOT_TIMEOUT_S:.0f} s")


async def sweep(gw: GatewayState, stop: asyncio.Event) -> None:
    """End sandboxes whose lifetime ran out (`expired`); their idle timeout is the worker's keep-warm."""
    while not stop.is_set():
        try:
            rows = await gw.pool.fetch(
                "SELECT workspace, container_id, extract(epoch FROM requested_at) AS created, "
                "(request->'spec'->'sandbox'->>'timeout_seconds')::int AS timeout FROM gateway.containers "
                "WHERE request->>'session_id' LIKE $1 AND status NOT IN ('stopped', 'failed', 'stopping')",
                SESSION_PREFIX + "%")
            for r in rows:
                why = expired(time.time(), float(r["created"]), r["timeout"] or 3600) if r["created"] else None
                if why:
                    await terminate(gw, r["workspace"], r["container_id"], why)
        except Exception:  # noqa: BLE001 - the database away for a moment: the next round tries again
            log.warning("the sandboxes' lifetime sweep failed; trying again", exc_info=True)
        try:
            await asyncio.wait_for(stop.wait(), timeout=SWEEP_EVERY_S)
        except asyncio.TimeoutError:
            pass
