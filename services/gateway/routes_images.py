"""Images: ask for a blueprint's build, list, inspect, stream a build's events, delete.

A blueprint's id is its content hash, so asking twice is asking once: a built image answers 200 at
once; a build in progress answers 202; an absent (or failed, or deleted) one is requested with the
image subject's last sequence as the expected version, so of two concurrent requests one appends
and the other, refused, answers 202 like any request that finds a build in progress.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator

import msgspec
import nats.errors
from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse, StreamingResponse
from nats.js.api import DeliverPolicy

from levers9.contracts import envelope, subjects
from levers9.contracts import events as E
from levers9.contracts.images import build_steps, image_id
from levers9.contracts.spec import ArchiveRef, ImageRef, ImageSpec
from levers9.runtime.bus import ConcurrencyConflict

from .auth import User
from .deps import Gateway
from .state import Gateway as GatewayState
from .state import row_json

router = APIRouter()

IN_PROGRESS = ("requested", "building", "pushed")
ENDS = ("ImageBuilt", "ImageBuildFailed", "ImageDeleted")
LIST_COLUMNS = ("image_id", "status", "size_bytes", "requested_at", "built_at", "updated_at", "steps", "reference",
                "requested_by", "reason")


class ImageRequest(msgspec.Struct, forbid_unknown_fields=True):
    blueprint: ImageSpec
    requested_by: str = ""


def parse_request(body: bytes) -> ImageRequest:
    """The POST body; HTTPException 422 naming the field otherwise. A blueprint's unknown key is
    refused too (ImageSpec would ignore it, and a misspelt `python_package` would build the base)."""
    try:
        raw = msgspec.json.decode(body)
        blueprint = raw.get("blueprint") if isinstance(raw, dict) else None
        unknown = sorted(set(blueprint) - set(ImageSpec.__struct_fields__)) if isinstance(blueprint, dict) else []
        if unknown:
            raise HTTPException(422, f"the image request is not valid: unknown field(s) {', '.join(unknown)} in "
                                     f"`$.blueprint` (known: {', '.join(ImageSpec.__struct_fields__)})")
        return msgspec.convert(raw, ImageRequest)
    except msgspec.ValidationError as exc:
        raise HTTPException(422, f"the image request is not valid: {exc}") from None
    except msgspec.DecodeError as exc:
        raise HTTPException(422, f"the image request is not JSON: {exc}") from None


async def build_row(gw: GatewayState, workspace: str, image: str) -> Any:
    return await gw.pool.fetchrow("SELECT * FROM gateway.builds WHERE workspace=$1 AND image_id=$2", workspace, image)


@router.post("/api/v1/images")
async def request_image(request: Request, caller: User, gw: Gateway) -> JSONResponse:
    req = parse_request(await request.body())
    image = image_id(req.blueprint)
    row = await build_row(gw, caller.workspace, image)
    status = row["status"] if row else ""
    if status == "built":
        return JSONResponse({"image_id": image, "status": "built", "cached": True, "reference": row["reference"],
                             "size_bytes": row["size_bytes"]})
    if status in IN_PROGRESS:
        return JSONResponse({"image_id": image, "status": status, "cached": False}, status_code=202)
    event = E.ImageBuildRequested(image_id=image, blueprint=req.blueprint, requested_by=req.requested_by[:200])
    try:
        appended = await gw.bus.append(envelope(event, workspace=caller.workspace), row["last_seq"] if row else 0)
    except ConcurrencyConflict:  # someone asked first (or our view lags behind a request): it is building
        return JSONResponse({"image_id": image, "status": "building", "cached": False}, status_code=202)
    await gw.wait_projected(appended.seq, "builds")
    return JSONResponse({"image_id": image, "status": "requested", "cached": False,
                         "steps": len(build_steps(req.blueprint))}, status_code=202)


@router.get("/api/v1/images")
async def list_images(caller: User, gw: Gateway) -> list[dict[str, Any]]:
    rows = await gw.pool.fetch(
        f"SELECT {', '.join(LIST_COLUMNS)} FROM gateway.builds WHERE workspace=$1 AND status <> 'deleted' "
        "ORDER BY updated_at DESC", caller.workspace)
    out = []
    for r in rows:
        doc = row_json(r, "steps")
        doc["steps"] = len(doc.get("steps") or [])
        out.append(doc)
    return out


@router.get("/api/v1/images/{image}")
async def get_image(image: str, caller: User, gw: Gateway) -> dict[str, Any]:
    row = await build_row(gw, caller.workspace, image)
    if row is None:
        raise HTTPException(404, f"no image {image!r} in workspace {caller.workspace!r}")
    doc = row_json(row, "blueprint", "steps", "step_states", "archive", "log_tail")
    states = doc.pop("step_states", None) or {}
    for step in doc.get("steps") or []:
        step.update({"text": step_text(step), **states.get(str(step["index"]), {"state": "waiting"})})
    return doc


def step_text(step: dict[str, Any]) -> str:
    from levers9.contracts.images import BuildStep

    return msgspec.convert(step, BuildStep).text


@router.get("/api/v1/images/{image}/events")
async def image_events(image: str, caller: User, gw: Gateway, follow: bool = False) -> StreamingResponse:
    """The image's events from the first, one JSON envelope a line; with follow, until the build
    ends (the last event being ImageBuilt, ImageBuildFailed or ImageDeleted) or the client leaves."""
    try:
        subject = subjects.filter_subject(workspace=caller.workspace, aggregate="image", aggregate_id=image)
    except ValueError:
        raise HTTPException(404, f"no image {image!r} in workspace {caller.workspace!r}") from None
    if await build_row(gw, caller.workspace, image) is None:  # with follow it would wait for ever
        raise HTTPException(404, f"no image {image!r} in workspace {caller.workspace!r}")
    return StreamingResponse(event_lines(gw, subject, follow), media_type="application/x-ndjson")


async def event_lines(gw: GatewayState, subject: str, follow: bool) -> AsyncIterator[bytes]:
    sub = await gw.bus.js.subscribe(subject, ordered_consumer=True, deliver_policy=DeliverPolicy.ALL,
                                    inactive_threshold=60.0)
    over = False
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=1.0 if not follow else 30.0)
            except (nats.errors.TimeoutError, asyncio.TimeoutError):
                if follow:
                    continue  # nothing new yet: the build is still going
                return
            yield msg.data.rstrip(b"\n") + b"\n"
            over = build_over(over, msg.subject.rsplit(".", 1)[-1])
            if msg.metadata.num_pending == 0 and (not follow or over):
                return
    finally:
        await sub.unsubscribe()


def build_over(over: bool, kind: str) -> bool:
    """Whether the image's build is over after an event of `kind`, given whether it was before: an
    end (built, failed, deleted) ends it, a new request starts another, anything else changes nothing.
    A progress line that lands after the end (a lagging builder's) must not keep a follower waiting
    for an end that already came (CI loaded run: the stream's last event was such a line)."""
    if kind in ENDS:
        return True
    return False if kind == "ImageBuildRequested" else over


@router.delete("/api/v1/images/{image}")
async def delete_image(image: str, caller: User, gw: Gateway) -> dict[str, Any]:
    row = await build_row(gw, caller.workspace, image)
    if row is None or row["status"] == "deleted":
        raise HTTPException(404, f"no image {image!r} in workspace {caller.workspace!r}: see `levers9 images list`")
    users = await gw.pool.fetch(
        "SELECT DISTINCT name FROM gateway.deployments WHERE workspace=$1 AND status = 'active' "
        "AND spec->'image_ref'->>'image_id' = $2 ORDER BY name", caller.workspace, image)
    if users:
        names = ", ".join(r["name"] for r in users)
        raise HTTPException(409, f"image {image} is used by deployment(s) {names}: delete or redeploy them first")
    await gw.publish(E.ImageDeleted(image_id=image), caller.workspace)
    return {"image_id": image, "deleted": True}


async def resolve_image(gw: GatewayState, workspace: str, blueprint: ImageSpec) -> ImageRef:
    """The built image a deploy names, as the worker needs it; HTTPException 409 when it is not built.
    Read once the builds projection holds the image's last event: a client that saw the build end in
    the log deploys at once, before this gateway may have projected it (a 409 in CI)."""
    image = image_id(blueprint)
    last = await gw.bus.last_seq(subjects.filter_subject(workspace=workspace, aggregate="image", aggregate_id=image))
    if last:
        await gw.wait_projected(last, "builds", timeout=10)
    row = await build_row(gw, workspace, image)
    status = row["status"] if row else "not requested"
    if status != "built":
        raise HTTPException(409, f"image {image} is not built (status {status}): `levers9 deploy` builds it "
                                 f"first; see `levers9 images logs {image}`")
    return image_ref_of(image, row)


def image_ref_of(image: str, row: Any) -> ImageRef:
    """A built image's row (gateway.builds) as a sandbox start needs it."""
    archive = row["archive"]
    if isinstance(archive, str):
        archive = json.loads(archive)
    return ImageRef(image_id=image, reference=row["reference"], digest=row["digest"],
                    archive=msgspec.convert(archive, ArchiveRef) if archive else None)
