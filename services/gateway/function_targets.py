"""Which deployment a function call runs in, and the router that hands out its sandboxes.

A deployed function (`levers9 deploy`, code.kind "function") is found by name like an endpoint. An
ad-hoc one (a client's `.remote` with no deploy) gets a deployment of its own, named after the hash
of its spec (`fn-<hash>`): every client calling the same function with the same options shares its
sandboxes; the function itself travels pickled with each call. Its image is built first when its
blueprint asks for one.

A session (`app.session()`) gets its own router with one sandbox, requested for it alone and kept
warm for `session_idle_seconds`; its calls go there and nowhere else.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import msgspec

from levers9.contracts import envelope, uuid7
from levers9.contracts import events as E
from levers9.contracts.checkpoint_policy import restore_choice
from levers9.contracts.images import image_id
from levers9.contracts.spec import Code, DeploymentSpec, FunctionOptions, InvalidSpec, decode_spec
from levers9.runtime.bus import ConcurrencyConflict
from levers9.runtime.catalogues import newest_of

from .router import DeploymentRouter
from .routes_images import build_row
from .routes_invoke import available_checkpoints, container_requested
from .state import Deployment
from .state import Gateway as GatewayState

IMAGE_WAIT_S = 1800.0
Progress = Callable[[str], Awaitable[None]]


class TargetError(Exception):
    """The call cannot run: `code` is a gRPC status name (NOT_FOUND, INVALID_ARGUMENT, ...)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def adhoc_spec(spec_json: str, name: str) -> DeploymentSpec:
    """The sandbox spec of an ad-hoc function: the client's spec with no code to fetch."""
    try:
        raw = json.loads(spec_json) if spec_json else {"name": name}
        if not isinstance(raw, dict):
            raise InvalidSpec("the function's spec is not a JSON object")
        # the function travels pickled: where it was defined (maybe a dotted module) is not the sandbox's
        raw["code"] = {"kind": "function", "module": "", "handler": ""}
        spec = decode_spec(json.dumps(raw))
    except ValueError as exc:  # InvalidSpec, or JSON that does not parse
        raise TargetError("INVALID_ARGUMENT", str(exc)) from None
    options = spec.function or FunctionOptions()
    digest = hashlib.sha256(msgspec.json.encode(spec)).hexdigest()[:16]
    return msgspec.structs.replace(spec, name=f"fn-{digest}", code=Code(kind="function", module="", handler=""),
                                   image_ref=None, function=options)


async def deployed(gw: GatewayState, workspace: str, app: str, name: str) -> Deployment:
    row = await gw.pool.fetchrow("SELECT * FROM gateway.deployments WHERE workspace=$1 AND name=$2 "
                                 "AND status='active' ORDER BY version DESC LIMIT 1", workspace, name)
    dep = Deployment.from_row(row) if row is not None else None
    if dep is None or dep.spec.code.kind != "function" or (app and dep.spec.app_name not in ("", app)):
        where = f" in app {app!r}" if app else ""
        raise TargetError("NOT_FOUND", f"no function {name!r}{where} in workspace {workspace!r}: deploy it with "
                                       "`levers9 deploy FILE`")
    return dep


async def adhoc(gw: GatewayState, workspace: str, spec: DeploymentSpec, progress: Progress) -> Deployment:
    """The deployment of an ad-hoc function's sandboxes, created on first use."""
    key = (workspace, spec.name, "latest")
    dep = gw.deployments.get(key)
    if dep is not None and dep.status == "active":
        return dep
    row = await gw.pool.fetchrow("SELECT * FROM gateway.deployments WHERE workspace=$1 AND name=$2 "
                                 "AND status='active' ORDER BY version DESC LIMIT 1", workspace, spec.name)
    if row is None:
        if spec.image is not None:
            spec = msgspec.structs.replace(spec, image_ref=await built_image(gw, workspace, spec, progress))
        elif spec.resources.gpus == 0:  # no image of its own: the flavor's catalogue image, when there is one
            spec = msgspec.structs.replace(spec, image_ref=await catalogue_image(gw))
        row = await create_first_version(gw, workspace, spec)
        if row is None:
            raise TargetError("UNAVAILABLE", f"the sandbox deployment {spec.name} is not projected yet; try again")
    dep = gw.deployments[key] = Deployment.from_row(row)
    return dep


async def create_first_version(gw: GatewayState, workspace: str, spec: DeploymentSpec) -> Any:
    """Append version 1 of `spec`'s deployment (a create that loses the race to another caller's is
    fine) and read back its newest row; None when it is not projected yet."""
    event = E.DeploymentCreated(deployment_id=f"{spec.name}-v1", name=spec.name, version=1, spec=spec)
    try:
        appended = await gw.bus.append(envelope(event, workspace=workspace), 0)
        await gw.wait_projected(appended.seq, "deployments")
    except ConcurrencyConflict:  # another call created it first
        await asyncio.sleep(0.2)
    return await gw.pool.fetchrow("SELECT * FROM gateway.deployments WHERE workspace=$1 AND name=$2 "
                                  "ORDER BY version DESC LIMIT 1", workspace, spec.name)


_catalogue_images: dict[str, tuple[float, Any]] = {}
CATALOGUE_TTL_S = 30.0


async def catalogue_image(gw: GatewayState, flavor: str = "cpu") -> Any:
    """The image of the newest catalogue of a flavor (every catalogued package installed), or None;
    read from S3 at most every CATALOGUE_TTL_S."""
    at, image = _catalogue_images.get(flavor, (0.0, None))
    if time.monotonic() - at > CATALOGUE_TTL_S:
        try:
            found = await newest_of(gw.settings, flavor) if gw.settings.storage.s3_endpoint else None
        except Exception:  # noqa: BLE001 - S3 away or a bad document: the platform base, as with no catalogue
            found = None
        image = found.image if found is not None else None
        _catalogue_images[flavor] = (time.monotonic(), image)
    return image


async def built_image(gw: GatewayState, workspace: str, spec: DeploymentSpec, progress: Progress) -> Any:
    """The function's image, built first when it is not (its progress reaches the caller's stderr)."""
    from .routes_images import resolve_image

    assert spec.image is not None
    image = image_id(spec.image)
    row = await build_row(gw, workspace, image)
    if row is None or row["status"] in ("failed", "deleted"):
        event = E.ImageBuildRequested(image_id=image, blueprint=spec.image, requested_by=f"function {spec.app_name}")
        try:
            await gw.bus.append(envelope(event, workspace=workspace), row["last_seq"] if row else 0)
        except ConcurrencyConflict:
            pass
        await progress(f"levers9: building image {image} for this function (first use)\n")
    deadline = time.monotonic() + IMAGE_WAIT_S
    while time.monotonic() < deadline:
        row = await build_row(gw, workspace, image)
        status = row["status"] if row else "requested"
        if status == "built":
            return await resolve_image(gw, workspace, spec.image)
        if status == "failed":
            raise TargetError("FAILED_PRECONDITION", f"image {image} failed to build: {row['error']}; "
                                                     f"see `levers9 images logs {image}`")
        await asyncio.sleep(1.0)
    raise TargetError("DEADLINE_EXCEEDED", f"image {image} was not built within {IMAGE_WAIT_S:.0f} s")


@dataclass
class Session:
    session_id: str
    workspace: str
    deployment_id: str
    router: DeploymentRouter
    last_used: float


class Sessions:
    """Sessions by id: each its own router holding one sandbox of the function's deployment."""

    def __init__(self, gw: GatewayState) -> None:
        self.gw = gw
        self.by_id: dict[str, Session] = {}

    def router(self, session_id: str, workspace: str, dep: Deployment) -> DeploymentRouter:
        s = self.by_id.get(session_id)
        if s is not None and (s.workspace != workspace or s.deployment_id != dep.deployment_id):
            raise TargetError("INVALID_ARGUMENT", "a session's calls must all go to one function of one app "
                                                  "(this session already runs another): open another session")
        if s is None:
            key = f"session:{session_id}"
            router = DeploymentRouter(key, max(1, dep.spec.scaling.concurrency), max_containers=1)
            self.gw.routers[key] = router
            s = self.by_id[session_id] = Session(session_id, workspace, dep.deployment_id, router, time.time())
        s.last_used = time.time()
        return s.router

    def request_container(self, session_id: str, dep: Deployment, correlation: str,
                          imports: list[str]) -> Callable[[], Awaitable[str]]:
        async def request() -> str:
            refs = await available_checkpoints(self.gw, dep) if dep.spec.checkpoint_enabled else ()
            warm = msgspec.structs.replace(dep.spec.scaling, keep_warm_seconds=self.gw.settings.functions.session_idle_seconds,
                                           scaledown_window=None,
                                           min_containers=0)
            kept = dataclasses.replace(dep, spec=msgspec.structs.replace(dep.spec, scaling=warm))
            # session_id: this sandbox is the session's alone, though it carries the deployment's id (the
            # autoscaler neither counts nor stops it; the worker keeps its keep-warm for it)
            event = msgspec.structs.replace(container_requested(kept, restore_choice(dep.spec, refs), uuid7()),
                                            imports=imports, session_id=session_id)
            self.gw.container_deployment[event.container_id] = f"session:{session_id}"
            await self.gw.publish(event, dep.workspace, correlation)
            return event.container_id
        return request

    async def end(self, session_id: str, workspace: str, reason: str) -> bool:
        s = self.by_id.get(session_id)
        if s is None or s.workspace != workspace:
            return False
        del self.by_id[session_id]
        self.gw.routers.pop(f"session:{session_id}", None)
        for cid in list(s.router.containers):
            await self.gw.publish(E.ContainerStopRequested(container_id=cid, reason=reason), workspace)
        return True

    async def sweep(self, stop: asyncio.Event) -> None:
        """End sessions idle for longer than session_idle_seconds (a client that vanished)."""
        idle = self.gw.settings.functions.session_idle_seconds
        while not stop.is_set():
            now = time.time()
            for s in list(self.by_id.values()):
                if now - s.last_used > idle and not any(slot.inflight for slot in s.router.containers.values()):
                    await self.end(s.session_id, s.workspace, f"session idle for {idle} s")
            try:
                await asyncio.wait_for(stop.wait(), timeout=min(30.0, idle / 2))
            except asyncio.TimeoutError:
                pass
