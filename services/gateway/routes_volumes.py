"""Volumes of a workspace: create, list, delete, and their files (ls, put, get, rm).

A volume's record is an event (VolumeCreated / VolumeDeleted, projected into gateway.volumes); its
files live in the platform's JuiceFS, which this gateway mounts on first use (levers9.runtime.juicefs)
at <data root>/gateway, the same file system every worker binds into containers. Another workspace's
volume answers 404, like any object of another workspace.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path
from typing import Any

import msgspec
from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import FileResponse
from pydantic import BaseModel

from levers9.contracts.events.volume import VolumeCreated, VolumeDeleted
from levers9.contracts.volumes import InvalidPath, VolumeName, volume_dir
from levers9.runtime import juicefs

from . import volume_files as files
from .auth import User
from .deps import Gateway
from .state import row_json

router = APIRouter()
PROJECTED_WITHIN_S = 10.0
MAX_PUT_BYTES = 1 << 30


class VolumeRequest(BaseModel):
    name: str


def _name(name: str) -> str:
    try:
        return msgspec.convert(name, VolumeName)
    except msgspec.ValidationError:
        raise HTTPException(400, f"volume name {name!r} must be 1-63 of a-z, 0-9 and '-', starting with a letter "
                                 "or digit") from None


async def _data(request: Request, gw: Any) -> Path:
    """This gateway's JuiceFS mount, made on first use (GatewayService.routes; unmounted at stop)."""
    try:
        return await request.app.state.juicefs.get()
    except juicefs.JuiceFSError as exc:
        raise HTTPException(503, f"volumes are not available: {exc}") from None


async def _exists(gw: Any, workspace: str, name: str) -> bool:
    return await gw.pool.fetchval("SELECT 1 FROM gateway.volumes WHERE workspace=$1 AND name=$2",
                                  workspace, name) is not None


async def _projected(gw: Any, workspace: str, name: str, present: bool) -> None:
    """Wait until this gateway's projection shows the change: the next call sees it."""
    deadline = time.monotonic() + PROJECTED_WITHIN_S
    while await _exists(gw, workspace, name) != present and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


async def _volume(request: Request, gw: Any, workspace: str, name: str) -> Path:
    if not await _exists(gw, workspace, _name(name)):
        raise HTTPException(404, f"no volume {name!r} in workspace {workspace!r}: create it with "
                                 f"`levers9 volumes create {name}`")
    return Path(volume_dir(str(await _data(request, gw)), workspace, name))


@router.post("/api/v1/volumes", status_code=201)
async def create_volume(body: VolumeRequest, request: Request, caller: User, gw: Gateway) -> dict[str, Any]:
    name = _name(body.name)
    if await _exists(gw, caller.workspace, name):
        raise HTTPException(409, f"volume {name!r} exists already in workspace {caller.workspace!r}")
    path = Path(volume_dir(str(await _data(request, gw)), caller.workspace, name))
    await asyncio.to_thread(path.mkdir, parents=True, exist_ok=True)
    await gw.publish(VolumeCreated(name=name), caller.workspace)
    await _projected(gw, caller.workspace, name, True)
    return {"name": name, "workspace": caller.workspace}


@router.get("/api/v1/volumes")
async def list_volumes(caller: User, gw: Gateway) -> list[dict[str, Any]]:
    rows = await gw.pool.fetch("SELECT name, created_at FROM gateway.volumes WHERE workspace=$1 ORDER BY name",
                               caller.workspace)
    return [row_json(r) for r in rows]


@router.delete("/api/v1/volumes/{name}")
async def delete_volume(name: str, request: Request, caller: User, gw: Gateway) -> dict[str, Any]:
    path = await _volume(request, gw, caller.workspace, name)
    await asyncio.to_thread(shutil.rmtree, path, True)
    await gw.publish(VolumeDeleted(name=name), caller.workspace)
    await _projected(gw, caller.workspace, name, False)
    return {"name": name, "deleted": True}


@router.get("/api/v1/volumes/{name}/ls")
async def ls(name: str, request: Request, caller: User, gw: Gateway, path: str = "") -> list[dict[str, Any]]:
    root = await _volume(request, gw, caller.workspace, name)
    return await _files(files.listing, root, path)


@router.put("/api/v1/volumes/{name}/files/{path:path}")
async def put(name: str, path: str, request: Request, caller: User, gw: Gateway) -> dict[str, Any]:
    root = await _volume(request, gw, caller.workspace, name)
    chunks, size = [], 0
    async for chunk in request.stream():  # held in memory up to MAX_PUT_BYTES, then written in one go
        size += len(chunk)
        if size > MAX_PUT_BYTES:
            raise HTTPException(413, f"a put takes at most {MAX_PUT_BYTES >> 20} MiB")
        chunks.append(chunk)
    written = await _files(files.write, root, path, chunks)
    return {"path": path, "size": written}


@router.get("/api/v1/volumes/{name}/files/{path:path}")
async def get(name: str, path: str, request: Request, caller: User, gw: Gateway) -> FileResponse:
    root = await _volume(request, gw, caller.workspace, name)
    return FileResponse(await _files(files.open_for_read, root, path), media_type="application/octet-stream")


@router.delete("/api/v1/volumes/{name}/files/{path:path}")
async def rm(name: str, path: str, request: Request, caller: User, gw: Gateway,
             recursive: bool = False) -> dict[str, Any]:
    root = await _volume(request, gw, caller.workspace, name)
    await _files(files.remove, root, path, recursive)
    return {"path": path, "deleted": True}


async def _files(fn: Any, *args: Any) -> Any:
    """A file operation in a thread; bad paths answer 400, missing ones 404."""
    try:
        return await asyncio.to_thread(fn, *args)
    except InvalidPath as exc:
        raise HTTPException(400, str(exc)) from None
    except files.NotFound as exc:
        raise HTTPException(404, str(exc)) from None
    except (IsADirectoryError, NotADirectoryError, FileExistsError) as exc:  # never the host path
        raise HTTPException(400, f"{exc.strerror}: a directory and a file of this path are in the way") from None
    except OSError as exc:  # full, read-only, refused by the mount: said without the host path an OSError carries
        raise HTTPException(409, f"the volume refused this ({exc.strerror or type(exc).__name__}): check the path "
                                 "and the volume's space") from None
