"""Catalogues of shared pre-import checkpoints: stored in S3, announced with CatalogueBuilt.

`levers9 catalogue build` posts the document it wrote (levers9.contracts.catalogue); the gateway
checks it, stores it under `catalogues/<flavor>/<id>.json` in the platform's bucket with a pointer
to the newest one per flavor, and appends CatalogueBuilt, which the scheduler and the workers load.
Only the admin workspace may publish one (its checkpoints serve every workspace); anyone may read.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, get_args

import msgspec
from fastapi import APIRouter, HTTPException, Request

from levers9.contracts import SYSTEM_WORKSPACE
from levers9.contracts import events as E
from levers9.contracts.catalogue import CatalogueError, Flavor, decode_catalogue, encode_catalogue
from levers9.runtime.catalogues import PLATFORM_BUCKET, newest_of
from levers9.runtime.storage import ensure_bucket, s3_client

from .auth import Admin, User
from .deps import Gateway
from .routes_images import build_row, image_ref_of

router = APIRouter()

MAX_CATALOGUE_BYTES = 8 << 20
FLAVORS = get_args(Flavor)


def keys(flavor: str, catalogue_id: str) -> tuple[str, str]:
    return f"catalogues/{flavor}/{catalogue_id}.json", f"catalogues/{flavor}/latest.json"


@router.post("/api/v1/catalogues", status_code=201)
async def publish(request: Request, caller: Admin, gw: Gateway) -> dict[str, Any]:
    body = await request.body()
    if len(body) > MAX_CATALOGUE_BYTES:
        raise HTTPException(413, f"a catalogue is at most {MAX_CATALOGUE_BYTES >> 20} MiB")
    try:
        cat = decode_catalogue(body)
    except CatalogueError as exc:
        raise HTTPException(422, str(exc)) from None
    if cat.image_id and cat.image is None:  # the flavor's image, as sandboxes of shared checkpoints need it
        row = await build_row(gw, caller.workspace, cat.image_id)
        if row is None or row["status"] != "built":
            raise HTTPException(409, f"the catalogue's image {cat.image_id} is not built in workspace "
                                     f"{caller.workspace!r}")
        cat = msgspec.structs.replace(cat, image=image_ref_of(cat.image_id, row))
    data = encode_catalogue(cat)
    key, latest = keys(cat.flavor, cat.catalogue_id)
    async with s3_client(gw.settings) as client:
        await ensure_bucket(client, PLATFORM_BUCKET)
        await client.put_object(Bucket=PLATFORM_BUCKET, Key=key, Body=data)
        await client.put_object(Bucket=PLATFORM_BUCKET, Key=latest, Body=json.dumps({"key": key}).encode())
    event = E.CatalogueBuilt(catalogue_id=cat.catalogue_id, flavor=cat.flavor, image_id=cat.image_id,
                             bucket=PLATFORM_BUCKET, key=key, sha256=hashlib.sha256(data).hexdigest(),
                             checkpoints=[c.checkpoint_id for c in cat.checkpoints])
    await gw.publish(event, SYSTEM_WORKSPACE)
    return {"catalogue_id": cat.catalogue_id, "flavor": cat.flavor, "key": key, "checkpoints": event.checkpoints}


@router.get("/api/v1/catalogues/{flavor}")
async def newest(flavor: str, caller: User, gw: Gateway) -> Any:
    if flavor not in FLAVORS:
        raise HTTPException(404, f"no flavor {flavor!r}: use one of {', '.join(FLAVORS)}")
    found = await newest_of(gw.settings, flavor)
    if found is None:
        raise HTTPException(404, f"no {flavor} catalogue yet: build one with `levers9 catalogue build`")
    return msgspec.to_builtins(found)
