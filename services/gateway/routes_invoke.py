"""Invocation: /endpoint/{name}[/vN|/latest][/sub/path] on any method.

Resolve the deployment (the newest active version, or the one named in the path), take a slot on a
ready container (router.py; a ContainerRequested is appended when the waiting calls need one more),
and proxy the call (proxy.py). A new container restores the checkpoint the one checkpoint policy
picks from this deployment version's stored checkpoints, or starts cold and says why.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import re
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, Sequence

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse, Response

from levers9.contracts import events as E
from levers9.contracts import uuid7
from levers9.contracts.checkpoint_policy import RestoreChoice, restore_choice
from levers9.contracts.spec import CheckpointRef
from levers9.runtime import telemetry

from . import idle_dumps, proxy, server_timing
from .auth import Caller, User
from .deps import Gateway
from .router import NoCapacity, QueueFull, Slot, StartFailed
from .state import Deployment, route_key
from .state import Gateway as GatewayState

router = APIRouter()

METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
VERSION_RE = re.compile(r"^v(\d+)$")
LATEST = "latest"
REFS_CONSIDERED = 8  # the newest stored checkpoints the policy chooses from


@dataclass(frozen=True)
class Target:
    which: str  # "vN" or "latest"
    version: int | None  # N when the path names a version
    rest: str  # the sub-path the container sees


def split_version(rest: str) -> Target:
    """`v3/a/b` -> version 3, sub-path `a/b`; `latest/a` -> the newest, `a`; anything else -> the newest, as is."""
    head, _, tail = rest.partition("/")
    match = VERSION_RE.fullmatch(head)
    if match:
        return Target(head, int(match.group(1)), tail)
    if head == LATEST:
        return Target(LATEST, None, tail)
    return Target(LATEST, None, rest)


def container_requested(dep: Deployment, choice: RestoreChoice, container_id: str) -> E.ContainerRequested:
    """The request for one more container of this deployment version, restoring `choice` when it can."""
    spec = dep.spec
    return E.ContainerRequested(
        container_id=container_id, deployment_id=dep.deployment_id, deployment_version=dep.version,
        resources=spec.resources, pool=spec.pool, spec=spec, checkpoint=choice.checkpoint, note=choice.note,
        reason="call waiting")


def checkpoint_ref(row: dict) -> CheckpointRef:
    return CheckpointRef(checkpoint_id=row["checkpoint_id"], accelerator=row["accelerator"], sha256=row["sha256"],
                         size_bytes=row["size_bytes"], bucket=row["bucket"], key=row["key"], location=row["location"])


async def available_checkpoints(gw: GatewayState, dep: Deployment) -> Sequence[CheckpointRef]:
    """This deployment version's stored checkpoints, newest first."""
    rows = await gw.pool.fetch(
        "SELECT checkpoint_id, accelerator, sha256, size_bytes, bucket, key, location FROM gateway.checkpoints "
        "WHERE workspace=$1 AND deployment_id=$2 AND status='available' "
        "ORDER BY created_at DESC, checkpoint_id DESC LIMIT $3", dep.workspace, dep.deployment_id, REFS_CONSIDERED)
    return [checkpoint_ref(r) for r in rows]


async def resolve(gw: GatewayState, workspace: str, name: str, rest: str) -> tuple[Deployment, str]:
    target = split_version(rest)
    key = (workspace, name, target.which)
    dep = gw.deployments.get(key)  # cleared whenever a deployment event is projected
    if dep is None:
        if target.version is not None:
            row = await gw.pool.fetchrow("SELECT * FROM gateway.deployments WHERE workspace=$1 AND name=$2 "
                                         "AND version=$3", workspace, name, target.version)
        else:
            row = await gw.pool.fetchrow("SELECT * FROM gateway.deployments WHERE workspace=$1 AND name=$2 "
                                         "AND status='active' ORDER BY version DESC LIMIT 1", workspace, name)
        if row is None:
            named = f" {target.which}" if target.version is not None else ""
            raise HTTPException(404, f"no endpoint {name!r}{named} in workspace {workspace!r}: deploy it with "
                                     "`levers9 deploy FILE`")
        dep = gw.deployments[key] = Deployment.from_row(row)
    if dep.spec.code.kind == "function":
        raise HTTPException(404, f"{name!r} is a function, not an endpoint: call it with POST "
                                 f"/function/{dep.spec.app_name or '<app>'}/{name} or from Python")
    if dep.spec.code.kind == "box":
        raise HTTPException(404, f"{name!r} is a box, not an endpoint: call it at /box/{name}/")
    if dep.status != "active":
        raise HTTPException(410, f"endpoint {name!r} version {dep.version} is {dep.status}")
    return dep, target.rest


log = logging.getLogger(__name__)

STOPPING_HEADER = "X-Levers9-Stopping"  # levers9.runner.server.STOPPING_HEADER
STOPPING_RETRIES = 3
QUEUE_FULL_RETRY_S = 1  # a full queue drains at the deployment's pace: come back soon, not at once
CLIENT_GONE = 499  # nginx's code for a request its client closed: below 500, so no error


async def invoke(gw: GatewayState, request: Request, caller: Caller, name: str, rest: str) -> Response:
    """Resolve and deliver the call, metering it (endpoint_meter.py): its status and the time from the
    request coming in to the answer's head going out; a call to no endpoint (404) is no deployment's."""
    began = time.monotonic()
    dep, subpath = await resolve(gw, caller.workspace, name, rest)
    return await metered(gw, request, caller, dep, subpath, name, began)


async def metered(gw: GatewayState, request: Request, caller: Caller, dep: Deployment, subpath: str, name: str,
                  began: float) -> Response:
    """Deliver a call to a resolved deployment (an endpoint's or a box's), metering it."""
    status = 500  # an exception other than HTTPException becomes a 500 (errors.py or Starlette)
    response: Response | None = None
    try:
        response = await deliver(gw, request, caller, dep, subpath, name)
        status = response.status_code
        return response
    except HTTPException as exc:
        status = exc.status_code
        raise
    except asyncio.CancelledError:
        status = CLIENT_GONE  # the caller hung up: counted, but not as the endpoint's error
        raise
    finally:
        meter(gw, dep, status, began, response)


def meter(gw: GatewayState, dep: Deployment, status: int, began: float, response: Response | None) -> None:
    """Count one call; never raises (the meter must not fail a call it only watches)."""
    try:
        now = dt.datetime.now(dt.timezone.utc)
        gw.meter.add(dep.workspace, dep.deployment_id, status, (time.monotonic() - began) * 1000, now)
        container_id = response.headers.get(proxy.CONTAINER_HEADER, "") if response is not None else ""
        if container_id:
            gw.meter.answered(dep.workspace, container_id, now)
    except Exception:  # noqa: BLE001
        log.exception("endpoint meter: a call was not counted")


def timing_of(began: float, acquired: float, slot: Slot) -> Callable[[float], str]:
    """The Server-Timing value for a call that came at `began` and got `slot` at `acquired`."""
    seen, restored = dict(slot.seen), slot.restored  # as they were when the call got its slot
    return lambda head: server_timing.header(server_timing.phases(began, acquired, head, seen, restored))


def requester(gw: GatewayState, dep: Deployment, caller: Caller, correlation: str) -> Callable[[], Awaitable[str]]:
    """What a waiting call runs to ask for one more container of `dep` (router.acquire)."""
    async def request_container() -> str:
        await idle_dumps.settle(gw, dep)  # a notebook restores the dump taken when it went idle
        refs = await available_checkpoints(gw, dep) if dep.spec.checkpoint_enabled else ()
        event = container_requested(dep, restore_choice(dep.spec, refs), uuid7())
        gw.container_deployment[event.container_id] = route_key(dep.workspace, dep.deployment_id)
        await gw.publish(event, caller.workspace, correlation)
        return event.container_id
    return request_container


def not_acquired(exc: Exception, name: str, correlation: str) -> JSONResponse:
    """The answer to a call that got no slot: a full queue (429), no container in time (503), or the
    container started for it failed (502). A refused WebSocket upgrade gets the same answer."""
    if isinstance(exc, QueueFull):
        return JSONResponse({"detail": f"the queue is full: {exc}; try again shortly", "correlation_id": correlation},
                            status_code=429, headers={"Retry-After": str(QUEUE_FULL_RETRY_S)})
    if isinstance(exc, NoCapacity):
        return JSONResponse({"detail": f"no capacity: {exc}", "correlation_id": correlation}, status_code=503,
                            headers={"Retry-After": "5"})
    return JSONResponse({"detail": f"the container for {name!r} failed to start: {exc}",
                         "correlation_id": correlation}, status_code=502)


NOT_ACQUIRED = (QueueFull, NoCapacity, StartFailed)
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def resend_cut(method: str, replayable: bool, ended: str) -> bool:
    """Whether a call cut before its answer (proxy.Cut) goes to another container: a safe method's,
    sent again as a browser or nginx would, unless its container failed (the call may be what killed
    it: a second container would die of it too). A POST may have run: its 502 says so instead."""
    return replayable and method in SAFE_METHODS and not ended.startswith("failed")


async def deliver(gw: GatewayState, request: Request, caller: Caller, dep: Deployment, subpath: str,
                  name: str) -> Response:
    length = int(request.headers.get("content-length") or 0)
    if length > gw.settings.gateway.max_body_bytes:
        raise HTTPException(413, f"the body is {length} bytes; the limit is {gw.settings.gateway.max_body_bytes}")
    router_ = await gw.router_for(dep)
    correlation = uuid7()
    telemetry.correlation_id.set(correlation)  # this call's log lines carry it
    timeout = float(dep.spec.timeout_seconds)
    request_container = requester(gw, dep, caller, correlation)

    # a container that began stopping between being chosen and being reached answers 503 with
    # STOPPING_HEADER and reads no call; one that already ended (or is cut off) refuses the connection
    # before the gateway has heard of its end. Either way the call was not delivered: the container is
    # dropped from the router and the call goes to another one (a sized body is kept by Starlette and
    # sent again; a streamed one cannot be)
    replayable = "transfer-encoding" not in request.headers
    began = time.monotonic()
    for attempt in range(1 + (STOPPING_RETRIES if replayable else 0)):
        try:
            slot = await router_.acquire(timeout, request_container)
        except NOT_ACQUIRED as exc:
            return not_acquired(exc, name, correlation)
        try:
            response = await proxy.forward(gw.session, request, slot.address, subpath, timeout,
                                           gw.settings.gateway.max_body_bytes, router_, slot,
                                           timing=timing_of(began, time.monotonic(), slot))
        except proxy.Unreached as exc:
            log.warning("container %s at %s: %s; the call goes elsewhere", slot.container_id, slot.address, exc)
            await router_.update(slot.container_id, "unreachable")
            if attempt == STOPPING_RETRIES or not replayable:
                return JSONResponse({"detail": str(exc), "correlation_id": correlation}, status_code=502)
            continue
        except proxy.NotAnswered as exc:
            log.warning("container %s at %s: %s", slot.container_id, slot.address, exc)
            if isinstance(exc, proxy.Cut) and attempt < STOPPING_RETRIES and resend_cut(request.method, replayable,
                                                                                         exc.ended):
                continue
            return JSONResponse({"detail": str(exc), "correlation_id": correlation}, status_code=502)
        if response.status_code != 503 or STOPPING_HEADER.lower() not in response.headers:
            break
        await router_.update(slot.container_id, "stopping")
    return response


@router.api_route("/endpoint/{name}", methods=METHODS)
async def invoke_root(name: str, request: Request, caller: User, gw: Gateway) -> Response:
    return await invoke(gw, request, caller, name, "")


@router.api_route("/endpoint/{name}/{rest:path}", methods=METHODS)
async def invoke_path(name: str, rest: str, request: Request, caller: User, gw: Gateway) -> Response:
    return await invoke(gw, request, caller, name, rest)
